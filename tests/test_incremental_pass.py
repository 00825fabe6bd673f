"""A deep pass that leaves out the lists which cannot start (core/passes.py, list_cannot_start)
makes the decisions of one that examines every pending job, and gives every pending job the
same reason.

Each case runs twice: once as shipped, once with ``Scheduler.leave_out_lists = False`` (the
full scan, the reference); every Start, Preempt and Stop of every pass must be the same, in the
same order, and after every pass each pending job's reason (message and ETA) the same. Random
small cases come from the invariant suite's Hypothesis strategies; seeded deep-queue replays on
a 256-GPU cluster make the left-out lists common (each asserts that lists were left out, so the
comparison is never vacuous).
"""

from __future__ import annotations

import dataclasses
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_invariants import Harness, scenarios

from jupyter_gpusched.core import (
    Cluster,
    JobState,
    PolicySettings,
    QueueTree,
    Scheduler,
    get_policy,
)
from jupyter_gpusched.core.user_limits import parse_user_limits
from jupyter_gpusched.sim import replay as replay_module
from jupyter_gpusched.sim.trace import TraceJob


def decisions_of(log: list) -> list:
    return [(now, decisions) for now, decisions, _pending in log]


def pending_reasons(sched: Scheduler) -> dict:
    """Each pending job's reason, after a pass."""
    return {job.id: job.reason for job in sched.jobs.values() if job.state == JobState.PENDING}


def harness_log(scenario: dict, policy: str, full_scan: bool) -> tuple[list, list]:
    """The decisions of every pass, and the pending jobs' reasons after each."""
    harness = Harness(scenario, policy, check=False)
    harness.sched.leave_out_lists = not full_scan
    after_each: list = []
    schedule = harness.sched.schedule

    def recording(now):
        decisions = schedule(now)
        after_each.append(pending_reasons(harness.sched))
        return decisions

    harness.sched.schedule = recording
    return decisions_of(harness.run()), after_each


@given(
    scenario=scenarios(mode="contended"),
    policy=st.sampled_from(["gpusched", "gpusched", "slurm", "priority"]),
)
def test_small_cases_decide_as_the_full_scan(scenario, policy):
    assert harness_log(scenario, policy, False) == harness_log(scenario, policy, True)


@given(scenario=scenarios(), policy=st.sampled_from(["gpusched", "fifo"]))
def test_mixed_cases_decide_as_the_full_scan(scenario, policy):
    assert harness_log(scenario, policy, False) == harness_log(scenario, policy, True)


# -- deep queues ---------------------------------------------------------------------------------
def deep_cluster() -> Cluster:
    nodes = [
        {"name": f"n[{leaf * 8 + 1:03d}-{leaf * 8 + 8:03d}]", "gpus": 8, "leaf": f"leaf-{leaf}"}
        for leaf in range(4)
    ]
    return Cluster.from_dict(
        {"nodes": nodes, "switches": {"spine": [f"leaf-{i}" for i in range(4)]}}
    )


def deep_queues(total: int) -> tuple[QueueTree, list[str]]:
    teams = {f"team{t}": {"guaranteed": total // 8, "limit": total} for t in range(8)}
    tree = {"org": {"children": teams}}
    return QueueTree.from_dict({"queues": tree}, total), [f"org/team{t}" for t in range(8)]


def deep_trace(seed: int, count: int, teams: list[str]) -> list[TraceJob]:
    """A burst that keeps the queue deep: mostly small jobs, some whole-node gangs, durations
    from 10 min to 10 h, walltime estimates up to 3x; some maintenance-free mix of tiers."""
    rng = random.Random(seed)
    jobs = []
    for i in range(count):
        gpus = rng.choice((1, 1, 1, 1, 2, 3, 4, 8, 16, 24))
        duration = float(rng.randint(600, 36_000))
        jobs.append(
            TraceJob(
                id=f"j{i:04d}",
                submit_time=rng.uniform(0, 600) if i < count * 0.8 else rng.uniform(0, 40_000),
                duration=duration,
                gpus=gpus,
                tier=rng.choices((1, 2, 3), weights=(10, 55, 35))[0],
                queue=rng.choice(teams),
                user=f"u{rng.randrange(12)}",
                kind="batch",
                gpus_per_node=8 if gpus >= 8 and rng.random() < 0.7 else None,
                walltime=float(round(duration * rng.uniform(1.0, 3.0))),
            )
        )
    jobs.sort(key=lambda j: j.submit_time)
    return jobs


def replay_decisions(trace, cluster, queues, settings, policy, full_scan: bool, monkeypatch):
    log: list = []
    schedulers = []

    class Recording(Scheduler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.leave_out_lists = not full_scan
            schedulers.append(self)

        def schedule(self, now):
            decisions = super().schedule(now)
            log.append((now, tuple(decisions), pending_reasons(self)))
            return decisions

    monkeypatch.setattr(replay_module, "Scheduler", Recording)
    result = replay_module.replay(trace, cluster, queues, settings, get_policy(policy))
    finished = {
        j.id: (j.state.value, j.first_start, j.end_time) for j in result.scheduler.jobs.values()
    }
    return log, finished, schedulers[0].lists_left_out


def assert_same_passes(new: list, full: list) -> None:
    """Every pass made the same decisions and left every pending job the same reason."""
    for (now, decisions, why), (full_now, full_decisions, full_why) in zip(new, full, strict=True):
        assert (now, decisions) == (full_now, full_decisions), f"first difference at t={now}"
        assert why == full_why, f"first difference in the reasons at t={now}"


@pytest.mark.parametrize(
    "seed,policy,depth,interval",
    [
        (1, "gpusched", 200, 30.0),
        (2, "gpusched", 4, 30.0),
        (3, "gpusched", 200, 0.0),
        (4, "slurm", 200, 30.0),
        (5, "slurm", 3, 0.0),
        (6, "gpusched", 12, 30.0),
    ],
)
def test_deep_queue_replays_decide_as_the_full_scan(seed, policy, depth, interval, monkeypatch):
    cluster = deep_cluster()
    queues, teams = deep_queues(cluster.total_gpus)
    settings = PolicySettings(backfill_depth=depth, backfill_interval=interval)
    trace = deep_trace(seed, 700, teams)
    new, new_jobs, left_out = replay_decisions(
        trace, cluster, queues, settings, policy, False, monkeypatch
    )
    full, full_jobs, none_left_out = replay_decisions(
        trace, cluster, queues, settings, policy, True, monkeypatch
    )
    assert none_left_out == 0
    assert left_out > 0, "no list was left out: the case does not test the shortcut"
    assert len(new) == len(full)
    assert_same_passes(new, full)
    assert new_jobs == full_jobs
    assert {state for state, _, _ in new_jobs.values()} == {"completed"}


def test_arrays_and_user_limits_get_the_full_scans_reasons(monkeypatch):
    """Job arrays with a cap on running elements and per-user limits in left-out lists: their
    jobs' reasons come from tests shared by kind of request (core/left_out.WalkReasons, keyed
    on array and user as well), and must still be those the full scan gives."""
    cluster = deep_cluster()
    tree, teams = deep_queues(cluster.total_gpus)
    limits = {"default": {"gpus": 40}, "u1": {"running_jobs": 6}, "u2": {"gpus": 12}}
    queues = QueueTree(tree.root, user_limits=parse_user_limits(limits, "test", {}))
    trace = [  # every fifth job an element of one of four capped arrays
        dataclasses.replace(job, array_id=f"a{i % 4}", array_index=i, array_max_running=3 + i % 4)
        if i % 5 == 0
        else job
        for i, job in enumerate(deep_trace(7, 700, teams))
    ]
    settings = PolicySettings()
    new, new_jobs, left_out = replay_decisions(
        trace, cluster, queues, settings, "gpusched", False, monkeypatch
    )
    full, full_jobs, _ = replay_decisions(
        trace, cluster, queues, settings, "gpusched", True, monkeypatch
    )
    assert left_out > 0, "no list was left out: the case does not test the shortcut"
    reasons_seen = {r.detail for _, _, why in full for r in why.values() if r is not None}
    assert {"array-limit", "user-limit", "reservation"} <= reasons_seen, reasons_seen
    assert_same_passes(new, full)
    assert new_jobs == full_jobs


def test_smallest_forgets_removed_entries_and_keeps_copies():
    from jupyter_gpusched.core.ordering import Smallest

    rng = random.Random(7)
    tracker, present = Smallest(), []
    for step in range(3000):
        if present and rng.random() < 0.5:
            entry = present.pop(rng.randrange(len(present)))
            tracker.remove(entry)
        else:
            entry = (float(rng.randrange(50)), f"j{rng.randrange(40)}")  # repeats on purpose
            present.append(entry)
            tracker.add(entry)
        assert tracker.first() == (min(present) if present else None), step
    assert len(tracker.heap) <= 2 * max(tracker.count, 64) + 1  # removed entries do not pile up


def test_the_pending_order_survives_heads_that_change_and_come_back():
    """``PendingQueue.ordered`` copies a heap of the lists' heads kept as heads change (stale
    entries left in it) instead of sorting every head per pass: whatever the adds, removes,
    re-adds (a requeued job takes its old place, and may be its list's head again) and
    re-keyed heads, every job comes once, in priority order, and stale entries do not pile up."""
    from jupyter_gpusched.core.jobs import Job
    from jupyter_gpusched.core.ordering import PendingQueue

    rng = random.Random(11)
    factor = {"a": 0.0, "b": 1.0, "c": 2.0}  # the queues' fair-share order, redrawn below
    jobs: dict[str, Job] = {}

    def key(job_id: str) -> tuple:
        job = jobs[job_id]
        return (job.tier, factor[job.queue], job.submit_time, job.id)

    queue = PendingQueue(key)
    present: set[str] = set()
    for step in range(4000):
        draw = rng.random()
        if present and draw < 0.45:
            job = jobs[rng.choice(sorted(present))]
            queue.remove(job, 3600.0)
            present.discard(job.id)
        elif draw < 0.47:
            factor.update(zip(factor, rng.sample([0.0, 1.0, 2.0], 3), strict=True))
            queue.refresh()
        else:
            job_id = f"j{rng.randrange(300):03d}"  # an id seen before comes back as it was
            if job_id in present:
                continue
            if job_id not in jobs:
                jobs[job_id] = Job(
                    id=job_id,
                    gpus=rng.choice((1, 2, 8)),
                    submit_time=float(rng.randrange(1000)),
                    tier=rng.choice((1, 2, 3)),
                    queue=rng.choice("abc"),
                )
            queue.add(jobs[job_id], 3600.0)
            present.add(job_id)
        assert list(queue.ordered()) == sorted(present, key=key), step
        assert len(queue.head_heap) <= 2 * len(queue.heads) + 65


def test_lists_are_left_out_when_the_reserved_nodes_are_full(monkeypatch):
    """With no GPU free on the reserved nodes, a list whose jobs fit nowhere outside them is
    left out even when some of its jobs are short enough to backfill (there is nothing to
    backfill onto): the case happens, and the decisions are still the full scan's."""
    from jupyter_gpusched.core import left_out
    from jupyter_gpusched.core import passes as passes_module

    seen = {"reserved_full": 0}

    def recording(sched, pass_, job, now):
        cannot = left_out.list_cannot_start(sched, pass_, job, now)
        if cannot and not any(sched.state.free[n] for n in sched.reservation.nodes):
            seen["reserved_full"] += 1
        return cannot

    monkeypatch.setattr(passes_module, "list_cannot_start", recording)
    cluster = deep_cluster()
    queues, teams = deep_queues(cluster.total_gpus)
    trace = deep_trace(1, 700, teams)
    settings = PolicySettings()
    new, new_jobs, _ = replay_decisions(
        trace, cluster, queues, settings, "gpusched", False, monkeypatch
    )
    full, full_jobs, _ = replay_decisions(
        trace, cluster, queues, settings, "gpusched", True, monkeypatch
    )
    assert seen["reserved_full"] > 0, "the case did not happen: nothing tested"
    assert new == full
    assert new_jobs == full_jobs
