"""The baselines behave as documented, through the same engine."""

from helpers import cluster, job, queues, run_replay, started, trace_job

from jupyter_gpusched.core import Scheduler


def reclaim_scenario():
    c = cluster(("n[1-4]", 8, "leaf"))
    tree = queues({"a": {"guaranteed": 16}, "b": {"guaranteed": 16}}, c)
    trace = [
        *(trace_job(f"a{i}", 0, 5000, 8, queue="a", tier=2) for i in range(4)),
        trace_job("b1", 100, 1000, 16, queue="b", tier=2),
    ]
    return c, tree, trace


def test_slurm_and_priority_never_reclaim_borrowed_guarantees():
    c, tree, trace = reclaim_scenario()
    for policy in ("slurm", "priority", "fifo"):
        result, rows = run_replay(trace, c, tree, policy=policy)
        assert result.preemptions == 0, policy
        assert rows["b1"]["start_time"] == 5000, policy
    result, rows = run_replay(trace, c, tree, policy="gpusched")
    assert result.preemptions == 2 and rows["b1"]["start_time"] < 5000


def test_priority_and_slurm_preempt_tier3_for_tier1():
    c = cluster(("n1", 8, "leaf"))
    tree = queues({"prod": {"guaranteed": 8}, "spot": {"guaranteed": 0}}, c)
    trace = [
        trace_job("spot", 0, 10_000, 8, queue="spot", tier=3),
        trace_job("prod", 50, 1000, 8, queue="prod", tier=1),
    ]
    for policy in ("priority", "slurm", "gpusched"):
        result, rows = run_replay(trace, c, tree, policy=policy)
        assert result.preemptions == 1, policy
        assert rows["spot"]["runs"] == 2, policy
    result, _ = run_replay(trace, c, tree, policy="fifo")
    assert result.preemptions == 0


def test_slurm_multifactor_lets_fair_share_outweigh_one_tier():
    c = cluster(("n1", 8, "leaf"))
    for policy, first in (("slurm", "light-t2"), ("gpusched", "heavy-t1")):
        tree = queues({"heavy": {"guaranteed": 4}, "light": {"guaranteed": 4}}, c)
        scheduler = Scheduler(c, tree, policy=policy)
        scheduler.submit(job("history", 8, queue="heavy"), 0)  # heavy: a day of 8 GPUs
        scheduler.schedule(0)
        scheduler.job_ended("history", 86_400)
        scheduler.submit(job("blocker", 8, queue="light", t=86_400), 86_400)
        scheduler.schedule(86_400)
        scheduler.submit(job("light-t2", 8, queue="light", tier=2, t=86_450), 86_450)
        scheduler.submit(job("heavy-t1", 4, queue="heavy", tier=1, t=86_500), 86_500)
        scheduler.schedule(86_500)
        scheduler.job_ended("blocker", 90_000)
        assert next(iter(started(scheduler.schedule(90_000)))) == first, policy


def test_priority_is_strict_tier_order_then_arrival():
    c = cluster(("n1", 8, "leaf"))
    scheduler = Scheduler(c, policy="priority")
    scheduler.submit(job("busy", 8), 0)
    scheduler.schedule(0)
    scheduler.submit(job("t2-early", 8, tier=2, t=1), 1)
    scheduler.submit(job("t1-late", 8, tier=1, t=2), 2)
    scheduler.schedule(2)
    scheduler.job_ended("busy", 10)
    assert list(started(scheduler.schedule(10))) == ["t1-late"]
