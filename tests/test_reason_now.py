"""A pending job's reason as it reads now, between two deep passes (core/reason_now.py).

Cluster: two nodes of 4 GPUs. "long" (4 GPUs, 1 h) and "other" (2 GPUs, 1 h) run with
"short" (2 GPUs, ends at t=20); alice's 4-GPU job holds the reservation, bob's 2-GPU job of
1 min waits behind it. The deep pass at t=0 left bob "needs 2 GPUs; 0 free"; "short" ends at
t=20, and the quick pass after it stops at alice's job.
"""

from __future__ import annotations

from helpers import cluster, job, queues, started

from jupyter_gpusched.core import Scheduler, reasons
from jupyter_gpusched.core.reason_now import reason_now


def waiting_behind_the_reservation() -> Scheduler:
    scheduler = Scheduler(cluster(("n[1-2]", 4, "leaf")))
    for name, gpus in (("long", 4), ("short", 2), ("other", 2)):
        scheduler.submit(job(name, gpus, walltime=3600.0, user=name), 0)
    assert set(started(scheduler.schedule(0))) == {"long", "short", "other"}
    scheduler.submit(job("alice", 4, t=1, walltime=600.0, user="alice"), 1)
    scheduler.submit(job("bob", 2, t=1, walltime=60.0, user="bob"), 1)
    scheduler.schedule(1)
    assert scheduler.reservation.job_id == "alice"
    assert scheduler.jobs["bob"].reason.message == "needs 2 GPUs; 0 free"
    scheduler.job_ended("short", 20)
    assert started(scheduler.schedule(20)) == {}  # a quick pass: it stops at alice's job
    return scheduler


def test_a_job_behind_the_reservation_says_gpus_were_freed_and_when_the_next_pass_checks():
    scheduler = waiting_behind_the_reservation()
    bob = scheduler.jobs["bob"]
    assert bob.reason.message == "needs 2 GPUs; 0 free"  # the engine's, from the deep pass
    now = reason_now(scheduler, bob, 20)
    assert (now.family, now.detail) == ("capacity", "awaiting-backfill")
    assert now.message == (
        "needs 2 GPUs; 2 free since the last backfill pass; the next one, within 10 s, checks "
        "whether it can start before job alice"
    )
    assert reason_now(scheduler, bob, 25).message.count("within 5 s") == 1
    assert bob.reason.message == "needs 2 GPUs; 0 free"  # the engine's own is not changed
    # the next deep pass, at t=30 (backfill.interval after the one at t=0), starts it
    assert scheduler.next_deep_pass() == 30
    assert set(started(scheduler.schedule(30))) == {"bob"}
    assert reason_now(scheduler, bob, 30) is None


def test_a_job_asking_more_than_is_free_now_gets_the_count_as_it_is_now():
    scheduler = waiting_behind_the_reservation()
    alice, bob = scheduler.jobs["alice"], scheduler.jobs["bob"]
    assert alice.reason.message == "needs 4 GPUs; 2 free"  # (the quick pass at t=20)
    assert reason_now(scheduler, alice, 20) is alice.reason
    # a 1-GPU job of 1 min ends before alice's reservation: the pass over it starts it
    scheduler.submit(job("dave", 1, t=21, walltime=60.0, user="dave"), 21)
    assert set(started(scheduler.schedule(21))) == {"dave"}
    for waiting, asks in ((alice, 4), (bob, 2)):
        now = reason_now(scheduler, waiting, 21)
        assert (now.detail, now.message) == ("gpus-busy", f"needs {asks} GPUs; 1 free")
        assert now.eta == waiting.reason.eta  # alice's reservation's start (bob has none)
    assert alice.reason.eta == 3600


def test_other_reasons_and_a_cluster_without_a_reservation_are_left_as_they_are():
    scheduler = waiting_behind_the_reservation()
    bob = scheduler.jobs["bob"]
    held = reasons.HELD.reason()
    scheduler._set_reason(bob, held)
    assert reason_now(scheduler, bob, 20) is held
    scheduler._set_reason(bob, reasons.GPUS_BUSY.reason(gpus=2.0, free=0.0))
    scheduler.reservation = None  # (as between an event and the pass it calls for)
    assert reason_now(scheduler, bob, 20) is bob.reason


def test_a_job_waiting_on_its_queue_limit_says_what_the_queue_uses_now():
    """The demo's case: bob's 4-GPU job waits on research's limit of 8 with 6 in use; his 2-GPU
    job submitted after it starts (a pass over new jobs only: the waiting job is not looked at
    again). Its reason reads the 8 in use now; once a job of the queue ends and the limit would
    let it start, it keeps the engine's reason until the pass that brings."""
    two = cluster(("n[1-3]", 4, "leaf"))
    tree = queues({"research": {"guaranteed": 8, "limit": 8}}, two)
    scheduler = Scheduler(two, tree)
    for name, gpus in (("alice", 2), ("b1", 4), ("b2", 4)):
        scheduler.submit(job(name, gpus, queue="research", walltime=3600.0), 0)
    assert set(started(scheduler.schedule(0))) == {"alice", "b1"}
    b2 = scheduler.jobs["b2"]
    assert b2.reason.message == (
        "queue research is at its limit of 8 GPUs (6 in use, the job asks for 4)"
    )
    scheduler.submit(job("b3", 2, t=5, queue="research", walltime=3600.0), 5)
    assert set(started(scheduler.schedule(5))) == {"b3"}
    assert b2.reason.message.count("(6 in use") == 1  # the engine's, from its last look
    now = reason_now(scheduler, b2, 5)
    assert (now.detail, now.message) == (
        "queue-limit",
        "queue research is at its limit of 8 GPUs (8 in use, the job asks for 4)",
    )
    assert reason_now(scheduler, b2, 6) == now
    scheduler.job_ended("b1", 10)
    assert reason_now(scheduler, b2, 10) is b2.reason  # room now: the pass to come says
    assert set(started(scheduler.schedule(10))) == {"b2"}


def test_a_job_behind_the_reservation_whose_queue_filled_up_since_says_so():
    """A pass looks at a job's quota before its GPUs: bob's 2-GPU job, waiting on GPUs behind
    alice's reservation, reads its queue's limit once a short job of his queue took the room
    under it (started by the pass over new jobs, which does not look at bob's again). A tour saw
    the old reason for 7 minutes with the queue full."""
    two = cluster(("n[1-2]", 4, "leaf"))
    limits = {"busy": (2, 8), "research": (4, 8), "team": (2, 3)}
    tree = queues({q: {"guaranteed": g, "limit": lim} for q, (g, lim) in limits.items()}, two)
    scheduler = Scheduler(two, tree)
    for name, gpus in (("long", 4), ("short", 2), ("other", 2)):
        scheduler.submit(job(name, gpus, queue="busy", walltime=3600.0, user=name), 0)
    assert set(started(scheduler.schedule(0))) == {"long", "short", "other"}
    scheduler.submit(job("alice", 4, t=1, queue="research", walltime=600.0, user="alice"), 1)
    scheduler.submit(job("bob", 2, t=1, queue="team", walltime=60.0, user="bob"), 1)
    scheduler.schedule(1)
    bob = scheduler.jobs["bob"]
    assert (scheduler.reservation.job_id, bob.reason.detail) == ("alice", "gpus-busy")
    scheduler.job_ended("short", 20)
    scheduler.schedule(20)
    assert reason_now(scheduler, bob, 20).detail == "awaiting-backfill"  # its quota lets it
    scheduler.submit(job("r1", 2, t=21, queue="team", walltime=30.0, user="carol"), 21)
    assert set(started(scheduler.schedule(21))) == {"r1"}
    assert bob.reason.detail == "gpus-busy"  # the engine's, from its last look
    now = reason_now(scheduler, bob, 21)
    assert (now.family, now.detail, now.message) == (
        "policy",
        "queue-limit",
        "queue team is at its limit of 3 GPUs (2 in use, the job asks for 2)",
    )
    # a held job keeps its reason whatever its queue uses (an admin's hold comes first)
    scheduler._set_reason(bob, reasons.HELD.reason())
    assert reason_now(scheduler, bob, 21).detail == "held"
