"""Shortest-first backfill (core/shortest_first.py): behind the reservation, a deep pass gives the
free GPUs to the shortest jobs first, within a tier, without delaying the reservation."""

import pytest
from helpers import cluster, run_replay, trace_job

from jupyter_gpusched.core import PolicySettings
from jupyter_gpusched.core.errors import ConfigError


def two_jobs_for_one_hole(tier_of_short=2):
    """n1 full until 1000; n2 has 2 GPUs that free at 100. ``big`` (16 GPUs) reserves both nodes
    from 1000; ``long`` (700 s) and ``short`` (100 s), 2 GPUs each, both end before that, and
    ``long`` comes first in priority order (submitted first)."""
    c = cluster(("n[1-2]", 8, "leaf"))
    trace = [
        trace_job("r1", 0, 1000, 8, walltime=1000),
        trace_job("r2", 0, 1000, 6, walltime=1000),
        trace_job("r3", 0, 100, 2, walltime=1000),  # ends early: its 2 GPUs are the hole
        trace_job("big", 10, 100, 16, walltime=100),
        trace_job("long", 20, 700, 2, walltime=700),
        trace_job("short", 30, 100, 2, walltime=100, tier=tier_of_short),
    ]
    return c, trace


def starts(rows, *ids):
    return [rows[job_id]["start_time"] for job_id in ids]


def test_the_shortest_job_behind_the_reservation_gets_the_hole_first():
    c, trace = two_jobs_for_one_hole()
    _, rows = run_replay(trace, c)
    # short runs 100-200, then long 200-900: both end before big's reservation at 1000
    assert starts(rows, "short", "long", "big") == [100, 200, 1000]


def test_in_priority_order_the_first_job_that_fits_gets_the_hole():
    c, trace = two_jobs_for_one_hole()
    settings = PolicySettings.from_dict({"backfill": {"order": "priority"}})
    _, rows = run_replay(trace, c, settings=settings)
    assert starts(rows, "long", "short", "big") == [100, 800, 1000]
    _, slurm_rows = run_replay(trace, c, policy="slurm")  # Slurm's backfill: priority order
    assert starts(slurm_rows, "long", "short", "big") == [100, 800, 1000]


def test_a_shorter_tier_3_job_does_not_take_the_hole_before_a_tier_2_job():
    c, trace = two_jobs_for_one_hole(tier_of_short=3)
    _, rows = run_replay(trace, c)
    assert rows["long"]["start_time"] == 100
    assert rows["short"]["start_time"] == 800
    assert rows["big"]["start_time"] == 1000


def test_a_job_that_would_outlast_the_reservation_still_keeps_off_the_reserved_nodes():
    c, trace = two_jobs_for_one_hole()
    trace[-1] = trace_job("short", 30, 100, 2, walltime=5000)  # planned past 1000: it may not
    _, rows = run_replay(trace, c)
    assert rows["long"]["start_time"] == 100
    assert rows["big"]["start_time"] == 1000
    assert rows["short"]["start_time"] >= 1100  # after big, which ran 1000-1100


@pytest.mark.parametrize("value", ["fastest", 1, None])
def test_a_bad_backfill_order_is_refused_naming_the_field(value):
    with pytest.raises(ConfigError) as refused:
        PolicySettings.from_dict({"backfill": {"order": value}})
    assert refused.value.field == "backfill.order"
    assert "shortest or priority" in str(refused.value)


def test_the_holders_reason_counts_the_gpus_free_after_the_jobs_behind_it_started():
    """The holder is examined before the jobs behind it start in the same pass: its reason then
    said "2 free" while the backfilled job held those 2 GPUs."""
    from helpers import job

    from jupyter_gpusched.core import Scheduler

    scheduler = Scheduler(cluster(("n[1-2]", 8, "leaf")))
    for job_id, gpus, walltime in (("r1", 8, 1000), ("r2", 6, 1000), ("r3", 2, 1000)):
        scheduler.submit(job(job_id, gpus, walltime=walltime), 0)
    scheduler.schedule(0)
    scheduler.submit(job("big", 16, t=10, walltime=100), 10)
    scheduler.submit(job("short", 2, t=20, walltime=100), 20)
    scheduler.schedule(20)
    scheduler.job_ended("r3", 100)
    scheduler.schedule(100)
    assert scheduler.jobs["short"].state.name == "RUNNING"
    reason = scheduler.jobs["big"].reason
    assert reason.message.startswith("needs 16 GPUs; 0 free"), reason.message
    assert reason.eta == 1000  # the reservation's start, as before


def test_in_the_demo_the_holders_reason_says_no_gpu_is_free_once_bobs_job_backfilled():
    """make demo's cluster and queues: bob's short job backfills beside alice's reservation (and
    takes research's room under its limit until it ends); alice's holder says 0 free, not 2."""
    from jupyter_gpusched.core import Job, Scheduler
    from jupyter_gpusched.files import load_cluster, load_queues

    c = load_cluster("hub_config/demo-cluster.yaml")
    scheduler = Scheduler(c, load_queues("hub_config/demo-queues.yaml", c))

    def submit(job_id, user, gpus, walltime, t):
        scheduler.submit(Job(id=job_id, gpus=gpus, submit_time=t, user=user, walltime=walltime), t)
        scheduler.schedule(t)

    submit("a-long", "alice", 4, 900, 0)
    submit("c-long", "carol", 2, 900, 0)
    submit("c-short", "carol", 2, 900, 0)
    submit("a-big", "alice", 4, 300, 3)
    submit("b-long", "bob", 2, 600, 4)
    submit("b-short", "bob", 2, 60, 5)
    scheduler.job_ended("c-short", 26)
    for now in range(26, 40):
        scheduler.schedule(now)
    assert scheduler.jobs["b-short"].state.name == "RUNNING"  # shortest first
    assert scheduler.jobs["b-long"].state.name == "PENDING"
    reason = scheduler.jobs["a-big"].reason
    assert reason.message == "needs 4 GPUs; 0 free" and reason.eta == 900, reason
