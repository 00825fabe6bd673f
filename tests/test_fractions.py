"""Fractional GPUs: shares of one GPU sum to at most 1, whole-GPU jobs never land on a shared
GPU, fractions count against quotas as themselves, and placement packs them."""

import pytest
from helpers import cluster, job, queues, run_replay, started, trace_job

from jupyter_gpusched.core import ConfigError, JobState, Scheduler
from jupyter_gpusched.core import scheduler as scheduler_module


def test_fractions_share_a_gpu_up_to_one():
    scheduler = Scheduler(cluster(("n1", 2, "leaf")))
    for name, fraction in (("a", 0.5), ("b", 0.3), ("c", 0.2)):
        scheduler.submit(job(name, 1, gpu_fraction=fraction), 0)
    placements = started(scheduler.schedule(0))
    assert {p.parts[0].mask for p in placements.values()} == {placements["a"].parts[0].mask}
    mask = placements["a"].parts[0].mask
    assert scheduler.state.shared[0] == {mask: pytest.approx(1.0)}
    assert scheduler.state.shared_room_total == pytest.approx(0.0)
    assert scheduler.state.free_total == 1
    scheduler.submit(job("d", 1, gpu_fraction=0.1, t=1), 1)
    d = started(scheduler.schedule(1))["d"]
    assert d.parts[0].mask != placements["a"].parts[0].mask  # the shared GPU is full


def test_whole_gpu_jobs_never_land_on_a_shared_gpu():
    scheduler = Scheduler(cluster(("n1", 2, "leaf")))
    scheduler.submit(job("frac", 1, gpu_fraction=0.25), 0)
    scheduler.schedule(0)
    scheduler.submit(job("whole", 2, t=1), 1)
    assert started(scheduler.schedule(1)) == {}
    assert scheduler.jobs["whole"].reason.family == "capacity"
    scheduler.submit(job("one", 1, t=2), 2)
    one = started(scheduler.schedule(2))["one"]
    frac_mask = scheduler.state.allocations["frac"].parts[0].mask
    assert one.parts[0].mask != frac_mask


def test_best_fit_picks_the_fullest_shared_gpu():
    scheduler = Scheduler(cluster(("n1", 4, "leaf")))
    scheduler.submit(job("x", 1, gpu_fraction=0.6), 0)
    scheduler.submit(job("y", 1, gpu_fraction=0.9, t=0.5), 0.5)
    placed = started(scheduler.schedule(0.5))
    assert placed["x"].parts[0].mask != placed["y"].parts[0].mask
    scheduler.submit(job("z", 1, gpu_fraction=0.1, t=1), 1)
    z = started(scheduler.schedule(1))["z"]
    assert z.parts[0].mask == placed["y"].parts[0].mask  # 0.1 room beats 0.4 room


def test_the_gpu_is_whole_again_when_its_last_share_leaves():
    scheduler = Scheduler(cluster(("n1", 1, "leaf")))
    scheduler.submit(job("a", 1, gpu_fraction=0.5), 0)
    scheduler.submit(job("b", 1, gpu_fraction=0.5), 0)
    scheduler.schedule(0)
    scheduler.job_ended("a", 5)
    assert scheduler.state.free_total == 0
    scheduler.job_ended("b", 6)
    assert scheduler.state.free_total == 1 and scheduler.state.shared[0] == {}


def test_fractions_count_against_quotas_as_themselves():
    c = cluster(("n1", 4, "leaf"))
    tree = queues({"team": {"guaranteed": 1, "limit": 1}, "other": {"guaranteed": 0}}, c)
    scheduler = Scheduler(c, tree)
    for i in range(4):
        scheduler.submit(job(f"f{i}", 1, queue="team", gpu_fraction=0.3, t=i), i)
    scheduler.schedule(3)
    states = [scheduler.jobs[f"f{i}"].state for i in range(4)]
    assert states.count(JobState.RUNNING) == 3  # 0.9 <= 1 < 1.2
    assert scheduler.jobs["f3"].reason.detail == "queue-limit"
    assert tree.get("team").running == pytest.approx(0.9)


def test_bad_fractions_are_refused():
    scheduler = Scheduler(cluster(("n1", 4, "leaf")))
    for bad in (job("two", 2, gpu_fraction=0.5), job("zero", 1, gpu_fraction=0.0)):
        with pytest.raises(ConfigError, match="gpu_fraction"):
            scheduler.submit(bad, 0)


def test_a_share_too_small_to_tell_from_none_is_refused():
    """gpu_fraction 1e-9 used to pass and then break every scheduling pass: with a GPU held
    whole, its "room" of 0 matched (the share minus the tolerance is <= 0) and placement took
    min() of no shared GPU."""
    scheduler = Scheduler(cluster(("n1", 2, "leaf")))
    scheduler.submit(job("whole", 1), 0)
    scheduler.schedule(0)
    for tiny in (1e-9, 2e-9, 1e-5):
        with pytest.raises(ConfigError, match="gpu_fraction"):
            scheduler.submit(job(f"tiny-{tiny}", 1, gpu_fraction=tiny, t=1), 1)
    scheduler.submit(job("smallest", 1, gpu_fraction=1e-4, t=1), 1)
    assert started(scheduler.schedule(1))["smallest"].parts[0].fraction == 1e-4


def test_a_tiny_share_that_got_in_waits_and_the_pass_goes_on(monkeypatch):
    """Placement itself never fails on a share it cannot place (say, one from an engine
    without the minimum): it waits, and the pass goes on."""
    scheduler = Scheduler(cluster(("n1", 2, "leaf")))
    scheduler.submit(job("whole", 1), 0)
    scheduler.submit(job("half", 1, gpu_fraction=0.5), 0)
    scheduler.schedule(0)  # the node: one GPU held whole (room 0), one half shared
    monkeypatch.setattr(scheduler_module, "validate", lambda job: None)  # past admission
    scheduler.submit(job("tiny", 1, gpu_fraction=1e-10, t=1), 1)
    decisions = scheduler.schedule(1)  # was: ValueError, min() of an empty sequence
    placed = started(decisions).get("tiny")
    assert placed is None or placed.parts[0].mask in scheduler.state.shared[0]
    scheduler.submit(job("quarter", 1, gpu_fraction=0.25, t=2), 2)
    scheduler.schedule(2)
    assert scheduler.jobs["quarter"].state == JobState.RUNNING  # not wedged


def test_replay_with_fractions_accounts_fractional_gpu_time():
    c = cluster(("n1", 1, "leaf"))
    trace = [trace_job(f"f{i}", 0, 100, 1, gpu_fraction=0.5) for i in range(4)]
    result, rows = run_replay(trace, c)
    assert rows["f0"]["start_time"] == 0 and rows["f1"]["start_time"] == 0
    assert rows["f2"]["start_time"] == 100 and rows["f3"]["start_time"] == 100
    assert sum(r.allocated_gpu_s for r in result.records.values()) == pytest.approx(200)
