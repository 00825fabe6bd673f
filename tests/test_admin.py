"""Admin operations on the engine (core/admin.py): hold and release, priority overrides,
maintenance windows, quota edits, per-user limits, and restoring running jobs after a restart.

Each test is a small hand-made scenario; the last one is a Hypothesis property over random
sequences of admin operations. Several tests pin engine bugs found while writing
this file (cancelling a held job, stale priority keys, maintenance and reservations, user limits
and pre-emption claims, non-finite limits, self-overlapping placements)."""

from __future__ import annotations

import math

import pytest
from helpers import cluster, job, queues, started
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jupyter_gpusched.core import (
    ConfigError,
    Job,
    JobState,
    Preempt,
    QueueTree,
    Reason,
    Scheduler,
    Start,
    Stop,
)
from jupyter_gpusched.core.state import Part, Placement

FAMILIES = ("capacity", "placement", "policy")


def node_index(scheduler: Scheduler, name: str) -> int:
    return scheduler.cluster.node(name).index


def node_names(scheduler: Scheduler, placement: Placement) -> list[str]:
    return [scheduler.cluster.nodes[i].name for i in placement.nodes]


# -- hold and release ------------------------------------------------------------------------
def test_a_held_job_is_not_started_and_says_it_is_held():
    """A held pending job is skipped by schedule() even with room for it; it stays PENDING
    with reason detail "held"."""
    scheduler = Scheduler(cluster(("n1", 8, "leaf")))
    scheduler.submit(job("a", 4), 0)
    scheduler.hold("a", 0)
    assert started(scheduler.schedule(0)) == {}
    a = scheduler.jobs["a"]
    assert a.state == JobState.PENDING
    assert a.held
    assert a.reason.family == "policy"
    assert a.reason.detail == "held"
    assert "a" not in scheduler.state.allocations
    assert scheduler.state.free_total == 8
    # later passes (something freed, time passing) still leave it alone
    scheduler.submit(job("b", 2, t=5), 5)
    assert set(started(scheduler.schedule(5))) == {"b"}
    scheduler.job_ended("b", 10)
    assert started(scheduler.schedule(10)) == {}
    assert a.state == JobState.PENDING and a.reason.detail == "held"


def test_a_released_job_starts_at_the_next_pass():
    """Release puts the job back in the queue; the next schedule() starts it."""
    scheduler = Scheduler(cluster(("n1", 8, "leaf")))
    scheduler.submit(job("a", 4), 0)
    scheduler.hold("a", 0)
    scheduler.schedule(0)
    released = scheduler.release("a", 20)
    assert not released.held
    assert released.reason is None
    assert set(started(scheduler.schedule(20))) == {"a"}
    assert scheduler.jobs["a"].state == JobState.RUNNING
    assert scheduler.jobs["a"].start_time == 20


def test_only_a_pending_job_can_be_held_or_released():
    """Holding (or releasing) a running job is a ConfigError; an unknown id is a KeyError."""
    scheduler = Scheduler(cluster(("n1", 8, "leaf")))
    scheduler.submit(job("run", 4), 0)
    scheduler.schedule(0)
    with pytest.raises(ConfigError, match="only a pending job can be held"):
        scheduler.hold("run", 1)
    with pytest.raises(ConfigError, match="only a pending job can be released"):
        scheduler.release("run", 1)
    assert scheduler.jobs["run"].state == JobState.RUNNING
    assert not scheduler.jobs["run"].held
    with pytest.raises(KeyError):
        scheduler.hold("nope", 1)


def test_a_job_submitted_on_hold_waits_until_released():
    """``Job(held=True)`` is pending with reason "held" from the start, and never started
    until released."""
    scheduler = Scheduler(cluster(("n1", 8, "leaf")))
    scheduler.submit(job("a", 2, held=True), 0)
    assert scheduler.jobs["a"].reason.detail == "held"
    assert started(scheduler.schedule(0)) == {}
    scheduler.submit(job("b", 2, t=1), 1)
    assert set(started(scheduler.schedule(1))) == {"b"}
    assert scheduler.jobs["a"].state == JobState.PENDING
    assert scheduler.jobs["a"].reason.detail == "held"
    scheduler.release("a", 2)
    assert set(started(scheduler.schedule(2))) == {"a"}


def test_a_held_job_can_be_cancelled():
    """Cancelling a held job ends it (CANCELLED, no reason left) and starts nothing."""
    scheduler = Scheduler(cluster(("n1", 8, "leaf")))
    scheduler.submit(job("a", 2), 0)
    scheduler.hold("a", 0)
    scheduler.schedule(0)
    scheduler.cancel("a", 1)
    assert scheduler.jobs["a"].state == JobState.CANCELLED
    assert scheduler.jobs["a"].reason is None
    assert scheduler.pending_gpus_by_reason["policy"] == 0
    assert started(scheduler.schedule(1)) == {}


def test_a_held_job_can_be_cancelled_while_others_of_its_queue_wait():
    """With other jobs in the held job's list, cancel works and leaves them queued."""
    scheduler = Scheduler(cluster(("n1", 8, "leaf")))
    scheduler.submit(job("busy", 8), 0)
    scheduler.schedule(0)
    scheduler.submit(job("a", 2, t=1), 1)
    scheduler.submit(job("b", 2, t=2), 2)
    scheduler.schedule(2)
    scheduler.hold("a", 3)
    scheduler.cancel("a", 3)
    assert scheduler.jobs["a"].state == JobState.CANCELLED
    assert [j.id for j in scheduler.pending_jobs(3)] == ["b"]
    assert scheduler.pending_gpus_by_reason["policy"] == 0
    scheduler.job_ended("busy", 4)
    assert set(started(scheduler.schedule(4))) == {"b"}


def test_holding_the_reserved_job_hands_the_reservation_to_the_next():
    """The top blocked job holds the reservation; once it is held, the next blocked job
    reserves instead (and a job behind it still may not backfill onto its GPUs)."""
    scheduler = Scheduler(cluster(("n1", 8, "leaf")))
    scheduler.submit(job("run", 6, walltime=100), 0)
    scheduler.schedule(0)
    scheduler.submit(job("b", 4, t=1, walltime=1000), 1)
    scheduler.submit(job("c", 4, t=2, walltime=1000), 2)
    scheduler.submit(job("d", 2, t=3, walltime=1000), 3)
    assert started(scheduler.schedule(3)) == {}
    assert scheduler.reservation.job_id == "b"
    assert scheduler.jobs["b"].reason.eta == 100
    assert scheduler.jobs["d"].reason.detail == "reservation"  # 2 GPUs free, but reserved

    scheduler.hold("b", 10)
    assert started(scheduler.schedule(10)) == {}
    assert scheduler.jobs["b"].reason.detail == "held"
    assert scheduler.reservation is not None
    assert scheduler.reservation.job_id == "c"
    assert scheduler.jobs["c"].reason.eta == 100
    assert scheduler.jobs["d"].state == JobState.PENDING

    # released, b is ahead of c again and takes the reservation back
    scheduler.release("b", 20)
    assert started(scheduler.schedule(20)) == {}
    assert scheduler.reservation.job_id == "b"
    scheduler.job_ended("run", 100)
    assert set(started(scheduler.schedule(100))) == {"b", "c"}


def test_holding_the_reserved_job_lets_a_job_behind_it_use_the_gpus():
    """Held, the reserved job no longer keeps a smaller job off the GPUs it had reserved."""
    scheduler = Scheduler(cluster(("n1", 8, "leaf")))
    scheduler.submit(job("run", 6, walltime=100), 0)
    scheduler.schedule(0)
    scheduler.submit(job("big", 4, t=1), 1)
    scheduler.submit(job("small", 2, t=2, walltime=1000), 2)
    assert started(scheduler.schedule(2)) == {}
    assert scheduler.jobs["small"].reason.detail == "reservation"
    scheduler.hold("big", 5)
    assert set(started(scheduler.schedule(5))) == {"small"}


# -- priority overrides ----------------------------------------------------------------------
def _three_waiting(policy: str) -> Scheduler:
    """One 8-GPU node, busy; three 8-GPU jobs a, b, c wait in that order."""
    scheduler = Scheduler(cluster(("n1", 8, "leaf")), policy=policy)
    scheduler.submit(job("busy", 8), 0)
    scheduler.schedule(0)
    for i, name in enumerate("abc", start=1):
        scheduler.submit(job(name, 8, t=i), i)
    scheduler.schedule(3)
    return scheduler


def _start_order(scheduler: Scheduler, first_end: float) -> list[str]:
    """End whatever runs, one job at a time, and list the pending jobs in start order."""
    order, now = [], first_end
    while scheduler.running:
        (running,) = scheduler.running
        scheduler.job_ended(running, now)
        order.extend(started(scheduler.schedule(now)))
        now += 100
    return order


@pytest.mark.parametrize("policy", ["gpusched", "fifo"])
def test_without_overrides_jobs_start_in_submit_order(policy):
    """The control for the override tests: a, b, c start in that order."""
    scheduler = _three_waiting(policy)
    assert _start_order(scheduler, 100) == ["a", "b", "c"]


@pytest.mark.parametrize("policy", ["gpusched", "fifo"])
def test_raising_the_last_jobs_priority_starts_it_first(policy):
    """Within a queue and tier (gpusched) or in arrival order (fifo), a higher priority goes
    first; the others keep their order."""
    scheduler = _three_waiting(policy)
    scheduler.set_priority("c", 10, 50)
    assert scheduler.jobs["c"].priority == 10
    assert [j.id for j in scheduler.pending_jobs(50)] == ["c", "a", "b"]
    assert started(scheduler.schedule(50)) == {}  # nothing is free: nothing starts yet
    assert scheduler.jobs["c"].reason is not None
    assert _start_order(scheduler, 100) == ["c", "a", "b"]


def test_lowering_a_priority_sends_a_job_back():
    """A negative priority ranks a job after the default-priority ones."""
    scheduler = _three_waiting("gpusched")
    scheduler.set_priority("a", -1, 50)
    scheduler.schedule(50)
    assert _start_order(scheduler, 100) == ["b", "c", "a"]


def test_priority_does_not_jump_tiers_under_gpusched():
    """Tiers stay strict: a tier-3 job with priority 100 goes after a tier-2 job with 0."""
    scheduler = Scheduler(cluster(("n1", 8, "leaf")))
    scheduler.submit(job("busy", 8, tier=2), 0)
    scheduler.schedule(0)
    scheduler.submit(job("t3", 8, t=1, tier=3), 1)
    scheduler.submit(job("t2", 8, t=2, tier=2), 2)
    scheduler.set_priority("t3", 100, 3)
    scheduler.schedule(3)
    assert [j.id for j in scheduler.pending_jobs(3)] == ["t2", "t3"]
    assert _start_order(scheduler, 100) == ["t2", "t3"]


def test_priority_of_a_held_job_applies_when_it_is_released():
    """set_priority on a held job is kept; on release it ranks by the new priority."""
    scheduler = _three_waiting("gpusched")
    scheduler.hold("c", 10)
    held = scheduler.set_priority("c", 5, 10)
    assert held.held and held.priority == 5
    assert held.reason.detail == "held"
    scheduler.release("c", 20)
    scheduler.schedule(20)
    assert [j.id for j in scheduler.pending_jobs(20)] == ["c", "a", "b"]
    assert _start_order(scheduler, 100) == ["c", "a", "b"]


@pytest.mark.parametrize("value", [1.5, "3", None, True])
def test_priority_must_be_a_whole_number(value):
    """A non-int priority is a ConfigError naming the field, and changes nothing."""
    scheduler = _three_waiting("gpusched")
    with pytest.raises(ConfigError) as error:
        scheduler.set_priority("c", value, 10)
    assert error.value.field == "priority"
    assert scheduler.jobs["c"].priority == 0
    assert [j.id for j in scheduler.pending_jobs(10)] == ["a", "b", "c"]


def test_set_priority_of_an_unknown_job_is_a_key_error():
    scheduler = Scheduler(cluster(("n1", 8, "leaf")))
    with pytest.raises(KeyError):
        scheduler.set_priority("nope", 1, 0)


# -- maintenance -----------------------------------------------------------------------------
def _two_nodes() -> Scheduler:
    return Scheduler(cluster(("a", 8, "leaf"), ("b", 8, "leaf")))


def test_without_maintenance_an_8_gpu_job_goes_to_the_first_node():
    """The control for the maintenance tests: placement prefers node a."""
    scheduler = _two_nodes()
    scheduler.submit(job("long", 8, walltime=2000), 0)
    assert node_names(scheduler, started(scheduler.schedule(0))["long"]) == ["a"]


def test_a_job_that_would_outlast_the_maintenance_start_is_kept_off_the_node():
    """Maintenance on a at t=1000: a job with walltime 2000 goes to b; one with walltime 500
    (ends at 500) may use a."""
    scheduler = _two_nodes()
    scheduler.set_maintenance("a", 1000, 0)
    scheduler.submit(job("long", 8, walltime=2000), 0)
    assert node_names(scheduler, started(scheduler.schedule(0))["long"]) == ["b"]
    scheduler.submit(job("short", 8, t=1, walltime=500), 1)
    assert node_names(scheduler, started(scheduler.schedule(1))["short"]) == ["a"]


def test_a_job_that_would_outlast_the_maintenance_start_waits_with_a_reason():
    """With b busy, the long job waits (a reason, not a placement on a)."""
    scheduler = _two_nodes()
    scheduler.set_maintenance("a", 1000, 0)
    scheduler.submit(job("busy", 8, walltime=5000), 0)
    assert node_names(scheduler, started(scheduler.schedule(0))["busy"]) == ["b"]
    scheduler.submit(job("long", 8, t=1, walltime=2000), 1)
    assert started(scheduler.schedule(1)) == {}
    long = scheduler.jobs["long"]
    assert long.state == JobState.PENDING
    assert long.reason is not None and long.reason.family in FAMILIES
    assert scheduler.state.free[node_index(scheduler, "a")] == 8


def test_a_job_kept_off_by_maintenance_does_not_reserve_that_node():
    """The long job cannot use a before its maintenance, so it must not reserve a (for now):
    the short job behind it, which ends before the window, starts on a."""
    scheduler = _two_nodes()
    scheduler.set_maintenance("a", 1000, 0)
    scheduler.submit(job("busy", 8, walltime=5000), 0)
    scheduler.schedule(0)
    scheduler.submit(job("long", 8, t=1, walltime=2000), 1)
    scheduler.submit(job("short", 8, t=2, walltime=500), 2)
    decisions = started(scheduler.schedule(2))
    long = scheduler.jobs["long"]
    assert long.reason.eta is None or long.reason.eta >= 1000
    assert "short" in decisions
    assert node_names(scheduler, decisions["short"]) == ["a"]


def test_the_node_is_drained_when_the_maintenance_starts():
    """next_wakeup() asks for a pass by t=1000; the pass at 1000 drains a and nothing new is
    placed there."""
    scheduler = _two_nodes()
    scheduler.set_maintenance("a", 1000, 0)
    scheduler.submit(job("long", 8, walltime=5000), 0)
    scheduler.submit(job("short", 4, walltime=500), 0)
    placed = started(scheduler.schedule(0))
    assert node_names(scheduler, placed["long"]) == ["b"]
    assert node_names(scheduler, placed["short"]) == ["a"]
    wake = scheduler.next_wakeup()
    assert wake is not None and wake <= 1000
    a = node_index(scheduler, "a")
    assert scheduler.state.node_state[a] == "up"
    scheduler.schedule(999)
    assert scheduler.state.node_state[a] == "up"

    scheduler.schedule(1000)
    assert scheduler.state.node_state[a] == "drain"
    assert scheduler.jobs["short"].state == JobState.RUNNING  # a drain lets running jobs end
    scheduler.submit(job("tiny", 1, t=1001, walltime=10), 1001)
    assert started(scheduler.schedule(1001)) == {}
    assert scheduler.jobs["tiny"].reason is not None
    scheduler.job_ended("short", 1100)
    assert started(scheduler.schedule(1100)) == {}  # a is drained, b is full
    assert scheduler.state.free_total == 0


def test_cancelled_maintenance_neither_keeps_jobs_off_nor_drains():
    """set_maintenance(None) cancels the window: long jobs may use the node again and no
    drain happens at the old start."""
    scheduler = _two_nodes()
    scheduler.set_maintenance("a", 1000, 0)
    scheduler.set_maintenance("a", None, 0)
    assert scheduler.maintenance == {}
    scheduler.submit(job("long", 8, walltime=2000), 0)
    assert node_names(scheduler, started(scheduler.schedule(0))["long"]) == ["a"]
    scheduler.schedule(1000)
    scheduler.schedule(1001)
    assert scheduler.state.node_state[node_index(scheduler, "a")] == "up"


def test_maintenance_of_an_unknown_node_is_an_error():
    scheduler = _two_nodes()
    with pytest.raises((KeyError, ValueError)):
        scheduler.set_maintenance("zz", 1000, 0)
    assert scheduler.maintenance == {}


# -- quota updates ---------------------------------------------------------------------------
QUEUES = {"vision": {"guaranteed": 8, "limit": 8}, "nlp": {"guaranteed": 8}}


def _limited() -> tuple[Scheduler, QueueTree]:
    """vision runs 8 GPUs, at its limit; v2 waits on queue-limit with 8 GPUs free."""
    c = cluster(("n[1-2]", 8, "leaf"))
    tree = queues(QUEUES, c)
    scheduler = Scheduler(c, tree)
    scheduler.submit(job("v1", 8, queue="vision"), 0)
    scheduler.schedule(0)
    scheduler.submit(job("v2", 4, queue="vision", t=1), 1)
    assert started(scheduler.schedule(1)) == {}
    assert scheduler.jobs["v2"].reason.detail == "queue-limit"
    return scheduler, tree


def test_a_raised_limit_lets_a_queue_limit_blocked_job_start():
    """update_quotas with the same queues and a higher limit: the next pass starts the job."""
    scheduler, tree = _limited()
    edited = {"vision": {"guaranteed": 8, "limit": 12}, "nlp": {"guaranteed": 8}}
    scheduler.update_quotas(queues(edited, scheduler.cluster), 5)
    assert tree.get("vision").limit == 12
    assert set(started(scheduler.schedule(5))) == {"v2"}


def test_running_totals_survive_a_quota_update():
    """The engine keeps its tree (and the GPUs counted running in it); only the figures
    change. Ending the job afterwards brings the totals back to zero."""
    scheduler, tree = _limited()
    edited = {"vision": {"guaranteed": 4, "limit": 12, "weight": 2}, "nlp": {"guaranteed": 12}}
    scheduler.update_quotas(queues(edited, scheduler.cluster), 5)
    assert scheduler.tree is tree
    vision = tree.get("vision")
    assert (vision.guaranteed, vision.limit, vision.weight) == (4, 12, 2)
    assert tree.get("nlp").guaranteed == 12
    assert vision.running == 8
    assert tree.root.running == 8
    assert tree.get("nlp").running == 0
    scheduler.schedule(5)
    assert vision.running == 12  # v2 started under the new limit
    scheduler.job_ended("v1", 10)
    scheduler.job_ended("v2", 10)
    assert vision.running == 0 and tree.root.running == 0


def test_a_lowered_limit_does_not_stop_running_jobs_but_blocks_new_ones():
    scheduler, tree = _limited()
    edited = {"vision": {"guaranteed": 4, "limit": 4}, "nlp": {"guaranteed": 8}}
    scheduler.update_quotas(queues(edited, scheduler.cluster), 5)
    decisions = scheduler.schedule(5)
    assert decisions == []
    assert tree.get("vision").limit == 4
    assert tree.get("vision").running == 8  # above the new limit, and left running
    assert scheduler.jobs["v1"].state == JobState.RUNNING
    assert scheduler.jobs["v2"].reason.detail == "queue-limit"


@pytest.mark.parametrize(
    "edited",
    [
        {**QUEUES, "audio": {"guaranteed": 0}},  # added
        {"vision": {"guaranteed": 8, "limit": 8}},  # removed
        {"vision": {"guaranteed": 8, "children": {"sub": {}}}, "nlp": {"guaranteed": 8}},
    ],
)
def test_adding_or_removing_queues_needs_a_restart(edited):
    """A tree with other queues is refused with a ConfigError that says to restart; nothing
    changes."""
    scheduler, tree = _limited()
    with pytest.raises(ConfigError, match="restart") as error:
        scheduler.update_quotas(queues(edited, scheduler.cluster), 5)
    assert error.value.field == "queues"
    assert tree.get("vision").limit == 8
    assert started(scheduler.schedule(5)) == {}
    assert scheduler.jobs["v2"].reason.detail == "queue-limit"


# -- per-user limits -------------------------------------------------------------------------
USER_LIMITS = {"default": {"gpus": 2, "running_jobs": 1}, "alice": {"gpus": 8}}


def _user_tree(c, user_limits=USER_LIMITS) -> QueueTree:
    return QueueTree.from_dict(
        {"queues": {"team": {"guaranteed": c.total_gpus}}, "user_limits": user_limits},
        c.total_gpus,
    )


def test_user_limits_are_read_from_the_queue_file():
    c = cluster(("n1", 8, "leaf"))
    tree = _user_tree(c)
    bob, alice = tree.user_limit("bob"), tree.user_limit("alice")
    assert (bob.gpus, bob.running_jobs, bob.pending_jobs) == (2, 1, None)
    assert (alice.gpus, alice.running_jobs) == (8, None)  # her own entry replaces default


def test_bobs_second_job_waits_on_his_user_limit_while_alice_runs_more():
    """bob (default: 1 running job, 2 GPUs) waits with "user-limit"; alice (8 GPUs, no job
    cap) starts three; when bob's first job ends his second starts."""
    c = cluster(("n1", 16, "leaf"))
    scheduler = Scheduler(c, _user_tree(c))
    scheduler.submit(job("bob1", 1, user="bob", queue="team"), 0)
    scheduler.submit(job("bob2", 1, t=1, user="bob", queue="team"), 1)
    for i in range(3):
        scheduler.submit(job(f"alice{i}", 2, t=2 + i, user="alice", queue="team"), 2 + i)
    assert set(started(scheduler.schedule(5))) == {"bob1", "alice0", "alice1", "alice2"}
    bob2 = scheduler.jobs["bob2"]
    assert bob2.state == JobState.PENDING
    assert bob2.reason.family == "policy"
    assert bob2.reason.detail == "user-limit"
    assert "bob" in bob2.reason.message

    # alice's GPU cap: 6 running, 2 more fit, 3 do not
    scheduler.submit(job("alice3", 3, t=6, user="alice", queue="team"), 6)
    scheduler.submit(job("alice4", 2, t=7, user="alice", queue="team"), 7)
    assert set(started(scheduler.schedule(7))) == {"alice4"}
    assert scheduler.jobs["alice3"].reason.detail == "user-limit"

    scheduler.job_ended("bob1", 10)
    assert set(started(scheduler.schedule(10))) == {"bob2"}


def test_the_gpu_cap_counts_gpus_not_jobs():
    """With running_jobs unset, a user under the GPU cap starts; over it waits."""
    c = cluster(("n1", 8, "leaf"))
    scheduler = Scheduler(c, _user_tree(c, {"default": {"gpus": 3}}))
    scheduler.submit(job("b1", 2, user="bob", queue="team"), 0)
    scheduler.submit(job("b2", 1, t=1, user="bob", queue="team"), 1)
    scheduler.submit(job("b3", 1, t=2, user="bob", queue="team"), 2)
    assert set(started(scheduler.schedule(2))) == {"b1", "b2"}
    assert scheduler.jobs["b3"].reason.detail == "user-limit"
    assert "limit per user is 3" in scheduler.jobs["b3"].reason.message


def test_user_limits_come_with_a_quota_update():
    """update_quotas takes the new user_limits too: bob's waiting job starts."""
    c = cluster(("n1", 8, "leaf"))
    scheduler = Scheduler(c, _user_tree(c))
    scheduler.submit(job("bob1", 1, user="bob", queue="team"), 0)
    scheduler.submit(job("bob2", 1, t=1, user="bob", queue="team"), 1)
    scheduler.schedule(1)
    assert scheduler.jobs["bob2"].reason.detail == "user-limit"
    scheduler.update_quotas(_user_tree(c, {"bob": {"running_jobs": 2}}), 5)
    assert set(started(scheduler.schedule(5))) == {"bob2"}


def test_user_limits_count_jobs_that_are_preempting():
    """bob may run 1 job: only one of his two tier-2 jobs pre-empts tier 3; after the victims
    leave he runs 1 job, and the other waits on user-limit."""
    c = cluster(("n1", 8, "leaf"))
    scheduler = Scheduler(c, _user_tree(c, {"default": {"running_jobs": 1}}))
    scheduler.submit(job("s1", 4, tier=3, user="carol", queue="team"), 0)
    scheduler.submit(job("s2", 4, tier=3, user="dave", queue="team"), 0)
    scheduler.schedule(0)
    scheduler.submit(job("b1", 4, t=10, user="bob", queue="team"), 10)
    scheduler.submit(job("b2", 4, t=11, user="bob", queue="team"), 11)
    victims = [d.job_id for d in scheduler.schedule(100) if isinstance(d, Preempt)]
    for victim in victims:
        scheduler.job_ended(victim, 160, "preempted")
    scheduler.schedule(160)
    bobs = [j for j in ("b1", "b2") if scheduler.jobs[j].state == JobState.RUNNING]
    assert len(bobs) <= 1
    assert len(victims) == 1


@pytest.mark.parametrize(
    ("user_limits", "field"),
    [
        ({"default": {"gpus": 2, "max_gpus": 4}}, "max_gpus"),  # unknown field
        ({"bob": {"gpus": -1}}, "gpus"),
        ({"bob": {"running_jobs": -1}}, "running_jobs"),
        ({"bob": {"running_jobs": 1.5}}, "running_jobs"),
        ({"bob": {"pending_jobs": 2.5}}, "pending_jobs"),
        ({"bob": {"gpus": "two"}}, "gpus"),
        ({"bob": {"running_jobs": True}}, "running_jobs"),
        ({"bob": 4}, "user_limits"),  # an entry that is not a mapping
        ([{"gpus": 2}], "user_limits"),  # user_limits itself not a mapping
    ],
)
def test_invalid_user_limits_are_config_errors_naming_the_field(user_limits, field):
    with pytest.raises(ConfigError) as error:
        QueueTree.from_dict({"queues": {"team": {}}, "user_limits": user_limits}, 8)
    assert error.value.field == field
    assert field in str(error.value)


@pytest.mark.parametrize("value", [math.inf, math.nan])
def test_a_non_finite_job_count_is_a_config_error(value):
    with pytest.raises(ConfigError) as error:
        QueueTree.from_dict(
            {"queues": {"team": {}}, "user_limits": {"bob": {"running_jobs": value}}}, 8
        )
    assert error.value.field == "running_jobs"


MEMBERS = {
    "research": {
        "groups": ["ml"],
        "children": {"vision": {"users": ["carol"]}, "nlp": {}},
    },
    "ops": {"users": ["dave"]},
    "open": {},
}


def _paths(found) -> set[str]:
    return {q.path for q in found}


def test_queues_for_follows_users_and_groups_on_the_queue_or_an_ancestor():
    tree = QueueTree.from_dict({"queues": MEMBERS}, 8)
    # a group on the parent opens both children
    assert _paths(tree.queues_for("erin", ["ml"])) == {"research/vision", "research/nlp"}
    # a user named on a leaf gets just that leaf
    assert _paths(tree.queues_for("carol")) == {"research/vision"}
    assert _paths(tree.queues_for("dave", ["other"])) == {"ops"}
    assert _paths(tree.queues_for("carol", ["ml"])) == {"research/vision", "research/nlp"}
    # a queue naming nobody is closed when the tree names someone elsewhere
    assert tree.queues_for("mallory", ["staff"]) == []
    # membership goes down the tree, not up: carol's leaf does not open its parent's siblings
    assert "ops" not in _paths(tree.queues_for("carol"))


def test_a_queue_tree_naming_nobody_is_open_to_all():
    tree = QueueTree.from_dict({"queues": {"a": {"children": {"x": {}, "y": {}}}, "b": {}}}, 8)
    assert _paths(tree.queues_for("anyone")) == {"a/x", "a/y", "b"}
    assert _paths(tree.queues_for("anyone", ["g"])) == {"a/x", "a/y", "b"}


# -- restore ---------------------------------------------------------------------------------
def _restored(**fields) -> Job:
    """A job that was running when the service stopped (4 GPUs since t=50, its 2nd run)."""
    values = {"id": "old", "gpus": 4, "submit_time": 0.0, "start_time": 50.0}
    values |= {"first_start": 10.0, "runs": 2, "walltime": 1000}
    return Job(**(values | fields))


def test_restored_jobs_hold_their_gpus_and_keep_their_history():
    """A restored job is RUNNING on exactly its placement, keeps start_time, runs and
    first_start, and no Start is emitted for it; new jobs are placed around it."""
    scheduler = Scheduler(cluster(("n1", 8, "leaf")))
    placement = Placement((Part(0, 0b1111_0000),))  # GPUs 4-7
    restored = scheduler.restore(_restored(), placement, 100)
    assert restored.state == JobState.RUNNING
    assert (restored.start_time, restored.first_start, restored.runs) == (50.0, 10.0, 2)
    assert scheduler.state.allocations["old"] == placement
    assert scheduler.state.free_mask[0] == 0b0000_1111
    assert scheduler.state.free_total == 4
    assert "old" in scheduler.running
    assert scheduler.schedule(100) == []  # nothing to announce

    scheduler.submit(job("new", 4, t=101), 101)
    decisions = scheduler.schedule(101)
    assert not any(isinstance(d, Start) and d.job_id == "old" for d in decisions)
    assert started(decisions)["new"].parts[0].mask == 0b0000_1111
    scheduler.submit(job("more", 1, t=102), 102)
    assert started(scheduler.schedule(102)) == {}


def test_a_restored_job_without_first_start_takes_its_start_time():
    scheduler = Scheduler(cluster(("n1", 8, "leaf")))
    restored = scheduler.restore(_restored(first_start=None), Placement((Part(0, 0b1111),)), 100)
    assert restored.first_start == 50.0


def test_restored_jobs_count_against_queue_limits():
    c = cluster(("n[1-2]", 8, "leaf"))
    scheduler = Scheduler(c, queues(QUEUES, c))
    scheduler.restore(_restored(gpus=8, queue="vision"), Placement((Part(1, 0xFF),)), 100)
    assert scheduler.tree.get("vision").running == 8
    scheduler.submit(job("v2", 2, t=101, queue="vision"), 101)
    assert started(scheduler.schedule(101)) == {}
    assert scheduler.jobs["v2"].reason.detail == "queue-limit"


def test_restored_jobs_count_against_user_limits():
    c = cluster(("n1", 8, "leaf"))
    scheduler = Scheduler(c, _user_tree(c))
    scheduler.restore(_restored(gpus=1, user="bob", queue="team"), Placement((Part(0, 0b1),)), 100)
    scheduler.submit(job("bob2", 1, t=101, user="bob", queue="team"), 101)
    assert started(scheduler.schedule(101)) == {}
    assert scheduler.jobs["bob2"].reason.detail == "user-limit"


def test_a_restored_job_ends_normally():
    """job_ended frees its GPUs and its quota, and a waiting job takes them."""
    c = cluster(("n[1-2]", 8, "leaf"))
    scheduler = Scheduler(c, queues(QUEUES, c))
    scheduler.restore(_restored(gpus=8, queue="vision"), Placement((Part(0, 0xFF),)), 100)
    scheduler.submit(job("v2", 8, t=101, queue="vision"), 101)
    scheduler.schedule(101)
    assert scheduler.jobs["v2"].reason.detail == "queue-limit"
    scheduler.job_ended("old", 200)
    old = scheduler.jobs["old"]
    assert old.state == JobState.COMPLETED and old.end_time == 200
    assert old.runs == 2
    assert "old" not in scheduler.state.allocations
    assert set(started(scheduler.schedule(200))) == {"v2"}
    assert scheduler.tree.get("vision").running == 8


def test_restoring_on_held_gpus_raises_and_changes_nothing():
    """GPUs already held (by a restored or a started job) cannot be restored again: a
    ValueError, and the state is as before."""
    scheduler = Scheduler(cluster(("n1", 8, "leaf")))
    scheduler.restore(_restored(), Placement((Part(0, 0b0011),)), 100)
    before = (scheduler.state.free_total, list(scheduler.state.free_mask))
    with pytest.raises(ValueError, match="not free"):
        scheduler.restore(_restored(id="clash"), Placement((Part(0, 0b0110),)), 100)
    assert (scheduler.state.free_total, list(scheduler.state.free_mask)) == before
    assert "clash" not in scheduler.jobs
    assert set(scheduler.running) == {"old"}
    with pytest.raises(ValueError, match="not in the cluster"):
        scheduler.restore(_restored(id="lost"), Placement((Part(5, 0b1),)), 100)
    with pytest.raises(ValueError, match="no GPU"):
        scheduler.restore(_restored(id="ghost"), Placement((Part(0, 1 << 8),)), 100)
    assert (scheduler.state.free_total, list(scheduler.state.free_mask)) == before
    assert set(scheduler.jobs) == {"old"}
    assert scheduler.pending_gpus_by_reason == {"capacity": 0, "placement": 0, "policy": 0}


def test_restoring_shares_of_one_gpu_up_to_a_whole():
    """Fractional jobs may be restored on one shared GPU while the shares fit; beyond, a
    ValueError; a whole-GPU job cannot be restored on the shared GPU."""
    scheduler = Scheduler(cluster(("n1", 2, "leaf")))
    for name in ("f1", "f2"):
        scheduler.restore(
            job(name, 1, gpu_fraction=0.5, start_time=10.0),
            Placement((Part(0, 1, fraction=0.5),)),
            20,
        )
    assert scheduler.state.shared[0] == {1: 1.0}
    with pytest.raises(ValueError, match="full"):
        scheduler.restore(
            job("f3", 1, gpu_fraction=0.25, start_time=10.0),
            Placement((Part(0, 1, fraction=0.25),)),
            20,
        )
    with pytest.raises(ValueError, match="not free"):
        scheduler.restore(job("w", 1, start_time=10.0), Placement((Part(0, 1),)), 20)
    assert scheduler.state.free_mask[0] == 0b10
    assert set(scheduler.jobs) == {"f1", "f2"}


def test_restoring_into_a_queue_that_no_longer_exists_raises():
    c = cluster(("n[1-2]", 8, "leaf"))
    scheduler = Scheduler(c, queues(QUEUES, c))
    with pytest.raises(ValueError, match="no longer exists"):
        scheduler.restore(_restored(queue="gone"), Placement((Part(0, 0b1111),)), 100)
    assert scheduler.jobs == {} and scheduler.state.free_total == 16
    assert scheduler.tree.root.running == 0


def test_restoring_needs_a_start_time_and_a_new_id():
    scheduler = Scheduler(cluster(("n1", 8, "leaf")))
    with pytest.raises(ValueError, match="no start time"):
        scheduler.restore(_restored(start_time=None), Placement((Part(0, 0b1111),)), 100)
    scheduler.restore(_restored(), Placement((Part(0, 0b1111),)), 100)
    with pytest.raises(ConfigError, match="already exists"):
        scheduler.restore(_restored(), Placement((Part(0, 0b1111_0000),)), 100)
    assert scheduler.state.free_total == 4


def test_restoring_a_placement_that_overlaps_itself_raises_and_changes_nothing():
    scheduler = Scheduler(cluster(("n1", 8, "leaf")))
    with pytest.raises(ValueError):
        scheduler.restore(_restored(gpus=2), Placement((Part(0, 0b1), Part(0, 0b1))), 100)
    assert scheduler.state.free_total == 8
    assert scheduler.jobs == {}


# -- property --------------------------------------------------------------------------------
PICK = st.integers(0, 40)
POOL = st.sampled_from(["pending", "pending", "held", "running", "any"])
SUBMIT = st.tuples(
    st.just("submit"),
    st.sampled_from([1, 2, 2, 3, 4, 4, 6, 8]),  # GPUs (the cluster has 2 nodes of 4)
    st.sampled_from([1, 2, 2, 3, 3]),  # tier
    st.sampled_from([False, False, False, True]),  # submitted on hold
    st.sampled_from([None, 100, 2000]),  # walltime
)
OPERATIONS = st.lists(
    st.one_of(
        SUBMIT,
        SUBMIT,
        SUBMIT,
        st.tuples(st.sampled_from(["hold", "release", "release", "cancel"]), PICK, POOL),
        st.tuples(st.just("priority"), PICK, POOL, st.integers(-2, 3)),
        st.tuples(st.just("end"), PICK),
        st.tuples(st.just("refuse"), PICK),  # the launcher refused its placement
        st.tuples(st.just("schedule"), st.sampled_from([0, 1, 30, 200, 700])),
        st.tuples(st.just("schedule"), st.sampled_from([0, 1, 30, 200, 700])),
    ),
    min_size=10,
    max_size=40,
)


class AdminHarness:
    """Drives a Scheduler through admin operations (pre-emption victims leave at the next
    pass, a stopped job at once) and checks the invariants after every schedule()."""

    def __init__(self, policy: str):
        c = cluster(("n[1-2]", 4, "leaf"))
        self.scheduler = Scheduler(c, policy=policy)
        self.now = 0.0
        self.ids: list[str] = []
        self.held: set[str] = set()  # what the engine should hold: hold/submit(held) - release
        self.victims: set[str] = set()
        self.retry_at: dict[str, float] = {}  # refused launches: not started before then
        self.launched: set[str] = set()  # jobs whose Start decision schedule() returned

    def pick(self, i: int, pool: str) -> str | None:
        s = self.scheduler
        if pool == "running":
            ids = sorted(s.running)
        elif pool == "held":
            ids = sorted(self.held)
        elif pool == "pending":
            ids = [j for j in self.ids if s.jobs[j].state == JobState.PENDING]
        else:
            ids = self.ids
        return ids[i % len(ids)] if ids else None

    def apply(self, op: tuple) -> None:
        s, kind = self.scheduler, op[0]
        if kind == "submit":
            _, gpus, tier, held, walltime = op
            job_id = f"j{len(self.ids)}"
            self.ids.append(job_id)
            new = job(job_id, gpus, t=self.now, tier=tier, held=held, walltime=walltime)
            s.submit(new, self.now)
            if held and new.state == JobState.PENDING:
                self.held.add(job_id)
        elif kind == "schedule":
            self.schedule(self.now + op[1])
        elif kind == "end":
            job_id = self.pick(op[1], "running")
            if job_id is not None:
                preempted = s.jobs[job_id].preempted_by is not None
                s.job_ended(job_id, self.now, "preempted" if preempted else "completed")
                self.victims.discard(job_id)
        elif kind == "refuse":  # only a launched job can be refused: its Start was delivered
            job_id = self.pick(op[1], "running")
            if job_id is not None and job_id in self.launched:
                s.job_ended(job_id, self.now, "refused", "no such node")
                self.victims.discard(job_id)
                if s.jobs[job_id].state == JobState.PENDING:
                    self.retry_at[job_id] = s.jobs[job_id].retry_at
                    assert self.retry_at[job_id] > self.now
        else:
            job_id = self.pick(op[1], op[2])
            if job_id is not None:
                self.admin(kind, s.jobs[job_id], op)

    def admin(self, kind: str, j: Job, op: tuple) -> None:
        s = self.scheduler
        if kind in ("hold", "release"):
            action = s.hold if kind == "hold" else s.release
            if j.state != JobState.PENDING:
                with pytest.raises(ConfigError):
                    action(j.id, self.now)
                return
            action(j.id, self.now)
            (self.held.add if kind == "hold" else self.held.discard)(j.id)
            if kind == "release":
                self.retry_at.pop(j.id, None)  # a release ends a back-off
            assert j.held == (kind == "hold")
        elif kind == "priority":
            s.set_priority(j.id, op[3], self.now)
            assert j.priority == op[3]
            assert j.held == (j.id in self.held)
        else:  # cancel, held or not
            s.cancel(j.id, self.now)
            self.held.discard(j.id)

    def schedule(self, now: float) -> None:
        s = self.scheduler
        self.now = now
        for victim in sorted(self.victims):  # signalled victims leave at the next pass
            if victim in s.running:
                s.job_ended(victim, now, "preempted")
        self.victims.clear()
        decisions = s.schedule(now)
        for decision in decisions:
            if isinstance(decision, Start):
                assert decision.job_id not in self.held, "a held job was started"
                retry_at = self.retry_at.pop(decision.job_id, -1.0)
                assert now >= retry_at, "a refused job was started before its back-off ended"
                self.launched.add(decision.job_id)
            elif isinstance(decision, Preempt):
                self.victims.add(decision.job_id)
            elif isinstance(decision, Stop) and decision.job_id in s.running:
                s.job_ended(decision.job_id, now)
        self.check()

    def check(self) -> None:
        s = self.scheduler
        used = [0] * len(s.cluster.nodes)
        for placement in s.state.allocations.values():  # running jobs and claims
            for part in placement.parts:
                assert not used[part.node] & part.mask, "a GPU is held twice"
                used[part.node] |= part.mask
        for idx, mask in enumerate(used):
            assert not mask & s.state.free_mask[idx], "a held GPU is counted free"
            assert s.state.free[idx] == s.state.free_mask[idx].bit_count()
        by_family = dict.fromkeys(FAMILIES, 0.0)
        for j in s.jobs.values():
            if j.id in self.held:
                assert j.state == JobState.PENDING and j.held
                assert j.reason is not None and j.reason.detail == "held"
                assert j.id not in s.state.allocations and j.id not in s._claims
            if j.state == JobState.PENDING:
                assert isinstance(j.reason, Reason), f"{j.id} pending without a reason"
                assert j.reason.family in FAMILIES
                by_family[j.reason.family] += j.amount
            else:
                assert not j.held
        for family, gpus in by_family.items():
            assert s.pending_gpus_by_reason[family] == pytest.approx(gpus)
        waiting = [
            j
            for j in s.jobs.values()
            if j.state == JobState.PENDING and not j.held and j.retry_at is None
        ]
        assert len(s.pending) == len(waiting), "the queue lost a job or holds one twice"


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(policy=st.sampled_from(["gpusched", "fifo"]), ops=OPERATIONS)
def test_admin_operations_keep_the_engine_invariants(policy, ops):
    """Random submit/hold/release/set_priority/cancel/job_ended/schedule sequences: no GPU is
    held twice, every pending job has one reason after each pass, held jobs never start."""
    harness = AdminHarness(policy)
    for op in ops:
        harness.apply(op)
    harness.schedule(harness.now + 1)
    assert not harness.held & set(harness.scheduler.running)
