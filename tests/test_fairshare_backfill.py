"""Order (tier, fair share, age) and reservation with EASY backfill."""

from pathlib import Path

import pytest
from helpers import cluster, job, queues, run_replay, started, trace_job

from jupyter_gpusched.core import PolicySettings, Scheduler
from jupyter_gpusched.core.fairshare import fair_share_factors
from jupyter_gpusched.core.quotas import decayed_usage


def test_team_with_less_decayed_usage_goes_first_even_when_it_submitted_later():
    c = cluster(("n1", 8, "leaf"))
    tree = queues({"heavy": {"guaranteed": 4}, "light": {"guaranteed": 4}}, c)
    scheduler = Scheduler(c, tree)
    # heavy used the whole node for a day; light used nothing
    scheduler.submit(job("history", 8, queue="heavy"), 0)
    scheduler.schedule(0)
    scheduler.submit(job("blocker", 8, queue="light", t=1), 1)
    scheduler.job_ended("history", 86_400)
    scheduler.schedule(86_400)  # blocker takes the node
    scheduler.submit(job("heavy-job", 8, queue="heavy", t=86_500), 86_500)
    scheduler.submit(job("light-job", 8, queue="light", t=86_600), 86_600)
    scheduler.schedule(86_600)
    scheduler.job_ended("blocker", 90_000)
    assert list(started(scheduler.schedule(90_000))) == ["light-job"]


def test_fair_share_factor_follows_weight_not_guarantee():
    c = cluster(("n1", 8, "leaf"))
    tree = queues({"a": {"guaranteed": 8, "weight": 1}, "b": {"guaranteed": 0, "weight": 3}}, c)
    scheduler = Scheduler(c, tree)
    for name in ("a", "b"):  # equal usage: 4 GPUs each for an hour
        scheduler.submit(job(f"{name}-use", 4, queue=name), 0)
    scheduler.schedule(0)
    for name in ("a", "b"):
        scheduler.job_ended(f"{name}-use", 3600)
    factors = fair_share_factors(tree, 3600, PolicySettings().fair_share_half_life)
    assert factors["b"] > factors["a"]  # b's share is 3/4 and it used half: it goes first


def test_usage_decays_with_the_half_life():
    c = cluster(("n1", 8, "leaf"))
    tree = queues({"a": {"guaranteed": 8}}, c)
    scheduler = Scheduler(c, tree, PolicySettings().replace(fair_share_half_life=100.0))
    scheduler.submit(job("x", 8, queue="a"), 0)
    scheduler.schedule(0)
    scheduler.job_ended("x", 100)
    queue = tree.get("a")
    from jupyter_gpusched.core.quotas import decayed_usage

    at_end = decayed_usage(queue, 100, 100.0)
    assert abs(decayed_usage(queue, 200, 100.0) - at_end / 2) < 1e-6


def test_short_small_job_backfills_only_when_it_ends_before_the_reservation():
    c = cluster(("n[1-2]", 8, "leaf"))
    trace = [
        trace_job("running", 0, 1000, 12, walltime=1000),
        trace_job("big", 10, 100, 16, walltime=100),  # blocked until t=1000: reserves
        trace_job("short", 20, 500, 2, walltime=500),  # ends at 520 <= 1000: backfills
        trace_job("long", 30, 5000, 2, walltime=5000),  # would delay big: waits
    ]
    _, rows = run_replay(trace, c)
    assert rows["short"]["start_time"] == 20
    assert rows["big"]["start_time"] == 1000
    assert rows["long"]["start_time"] > 1000
    assert rows["long"]["first_reason"] == "policy"
    assert rows["long"]["first_reason_detail"] == "reservation"


def test_stream_of_one_gpu_jobs_does_not_starve_a_16_gpu_job():
    c = cluster(("n[1-2]", 8, "leaf"))
    trace = [trace_job("big", 5, 100, 16, walltime=200)]
    # a 1-GPU job every 10 s, each running 300 s: without a reservation the cluster never empties
    trace += [trace_job(f"s{i:03d}", i * 10, 300, 1, walltime=300) for i in range(300)]
    _, rows = run_replay(trace, c)
    assert rows["big"]["start_time"] <= 310  # once the first 1-GPU jobs end
    _, fifo_rows = run_replay(trace, c, policy="fifo")
    assert fifo_rows["big"]["start_time"] > 2900  # fifo lets the stream starve it


def test_higher_tier_goes_first():
    c = cluster(("n1", 8, "leaf"))
    scheduler = Scheduler(c)
    scheduler.submit(job("busy", 8), 0)
    scheduler.schedule(0)
    scheduler.submit(job("t3", 8, tier=3, t=1), 1)
    scheduler.submit(job("t2", 8, tier=2, t=2), 2)
    scheduler.schedule(2)
    scheduler.job_ended("busy", 10)
    assert list(started(scheduler.schedule(10))) == ["t2"]


def test_usage_rebuilt_from_past_runs_equals_the_usage_the_engine_accounted():
    """A restarted service rebuilds fair share from its allocations (QueueTree.seed_usage):
    the decayed usage must be what the engine had accounted for the same runs."""
    c = cluster(("n1", 8, "leaf"))
    spec = {"team": {"guaranteed": 8, "children": {"a": {"guaranteed": 4}, "b": {}}}}
    live = Scheduler(c, queues(spec, c))
    runs = {"r0": ("team/a", 4, 0.0, 7200.0), "r1": ("team/b", 2, 3600.0, 90_000.0)}
    runs["r2"] = ("team/a", 2, 50_000.0, None)  # still running
    events = sorted(
        [(start, "start", name) for name, (_, _, start, _) in runs.items()]
        + [(end, "end", name) for name, (*_, end) in runs.items() if end is not None]
    )
    for t, what, name in events:
        if what == "start":
            queue, gpus, *_ = runs[name]
            live.submit(job(name, gpus, t=t, queue=queue), t)
            live.schedule(t)
        else:
            live.job_ended(name, t)
    assert all(live.jobs[n].first_start == runs[n][2] for n in runs)
    now = 100_000.0
    rebuilt = queues(spec, c)
    rebuilt.seed_usage(
        [(q, g, s, now if e is None else e) for q, g, s, e in runs.values()], now, live.half_life
    )
    for path in ("team/a", "team/b", "team", ""):
        expected = decayed_usage(live.tree.get(path), now, live.half_life)
        assert abs(rebuilt.get(path).usage - expected) < 1e-6 * expected, path
    assert rebuilt.get("team/a").usage > 0 and rebuilt.get("team/b").usage > 0


def test_a_backfill_depth_below_one_is_refused_and_one_still_starts_every_job():
    """depth 0 stopped every full pass before its first job, so jobs that could not start at
    their submission never started (a replay ended with them waiting); 1 is the least."""
    from jupyter_gpusched.core.errors import ConfigError
    from jupyter_gpusched.sim.cluster_loaders import load_cluster_spec, load_queue_spec
    from jupyter_gpusched.sim.trace import read_trace

    with pytest.raises(ConfigError) as error:
        PolicySettings.from_dict({"backfill": {"depth": 0}})
    assert "backfill.depth" in str(error.value) and "at least 1" in str(error.value)
    examples = Path(__file__).resolve().parent.parent / "examples"
    trace = read_trace(examples / "trace.csv")
    cluster = load_cluster_spec(str(examples / "cluster.yaml")).cluster
    tree = load_queue_spec(str(examples / "queues.yaml"), cluster, trace, "trace.csv")
    shallow = PolicySettings.from_dict({"backfill": {"depth": 1, "interval": "30s"}})
    _, rows = run_replay(trace, cluster, tree, shallow)
    assert {row["state"] for row in rows.values()} <= {"completed", "rejected"}
    assert sum(row["state"] == "completed" for row in rows.values()) > 350
