"""A launch the backend refused (core/retries.py): the job goes back to pending with a reason,
keeps its place, and is retried after a back-off that doubles up to a maximum; holds, releases,
cancels and priority changes during the back-off leave one copy of it in the queue."""

from __future__ import annotations

import pytest
from helpers import cluster, job, preempted, started

from jupyter_gpusched.core import ConfigError, JobState, Scheduler
from jupyter_gpusched.core.settings import PolicySettings

SETTINGS = PolicySettings.from_dict({"launch": {"retry_delay": "10s", "max_retry_delay": "30s"}})


def _refuse(scheduler: Scheduler, job_id: str, now: float) -> None:
    scheduler.job_ended(job_id, now, "refused", "sbatch: Invalid node name specified")


def _start_time(scheduler: Scheduler, job_id: str, t0: float, t1: float) -> float | None:
    """The first whole second in [t0, t1] at which a pass starts ``job_id``."""
    for t in range(int(t0), int(t1) + 1):
        if job_id in started(scheduler.schedule(float(t))):
            return float(t)
    return None


def test_a_refused_job_waits_out_a_doubling_back_off_then_runs():
    scheduler = Scheduler(cluster(("n1", 8, "leaf")), settings=SETTINGS)
    scheduler.submit(job("a", 4), 0)
    assert "a" in started(scheduler.schedule(0))
    _refuse(scheduler, "a", 1)
    a = scheduler.jobs["a"]
    assert a.state == JobState.PENDING and a.refusals == 1
    assert a.reason.family == "placement" and a.reason.detail == "launch-refused"
    assert "Invalid node name specified" in a.reason.message
    assert "refusal 1 in a row" in a.reason.message
    assert scheduler.state.free_total == 8  # its GPUs went back
    assert scheduler.next_wakeup() == 11
    assert _start_time(scheduler, "a", 1, 40) == 11  # 10 s back-off
    _refuse(scheduler, "a", 12)
    assert _start_time(scheduler, "a", 12, 60) == 32  # doubled: 20 s
    _refuse(scheduler, "a", 33)
    assert _start_time(scheduler, "a", 33, 90) == 63  # 40 s, capped at 30 s
    assert scheduler.jobs["a"].runs == 4
    scheduler.job_ended("a", 70)  # a run that is not refused resets the count
    assert scheduler.jobs["a"].state == JobState.COMPLETED
    assert scheduler.jobs["a"].refusals == 0


def test_other_jobs_run_while_one_backs_off_and_it_keeps_its_place():
    scheduler = Scheduler(cluster(("n1", 8, "leaf")), settings=SETTINGS)
    scheduler.submit(job("a", 8), 0)
    scheduler.schedule(0)
    _refuse(scheduler, "a", 1)
    scheduler.submit(job("b", 4, t=2), 2)
    assert "b" in started(scheduler.schedule(2))  # a waits; b needs no back-off
    scheduler.submit(job("c", 8, t=3), 3)
    scheduler.job_ended("b", 20)
    # at 20 a's back-off is over; a (submitted first) goes before c
    assert set(started(scheduler.schedule(20))) == {"a"}
    assert scheduler.jobs["c"].state == JobState.PENDING


def test_hold_release_cancel_and_priority_during_a_back_off():
    scheduler = Scheduler(cluster(("n1", 8, "leaf")), settings=SETTINGS)
    for name in ("a", "b", "c"):
        scheduler.submit(job(name, 2), 0)
    scheduler.schedule(0)
    for name in ("a", "b", "c"):
        _refuse(scheduler, name, 1)
    scheduler.hold("a", 2)
    assert scheduler.jobs["a"].reason.detail == "held"
    scheduler.release("a", 3)  # the release ends the back-off: it is queued once, now
    assert "a" in started(scheduler.schedule(3))
    scheduler.cancel("b", 4)
    scheduler.set_priority("c", 5, 5)
    assert scheduler.jobs["c"].state == JobState.PENDING
    assert started(scheduler.schedule(6)) == {}  # c still waits out its back-off
    assert set(started(scheduler.schedule(11))) == {"c"}  # b, cancelled, never comes back
    assert scheduler.jobs["b"].state == JobState.CANCELLED
    assert len(scheduler.pending) == 0
    scheduler.job_ended("a", 12)
    scheduler.job_ended("c", 12)
    assert scheduler.state.free_total == 8


def test_a_refused_notebook_fails_for_its_spawner_to_report():
    scheduler = Scheduler(cluster(("n1", 8, "leaf")), settings=SETTINGS)
    scheduler.submit(job("nb", 1, kind="notebook"), 0)
    scheduler.schedule(0)
    _refuse(scheduler, "nb", 1)
    assert scheduler.jobs["nb"].state == JobState.FAILED
    assert scheduler.next_wakeup() is None


@pytest.mark.parametrize(
    "launch, field",
    [
        ({"retry_delay": "0s"}, "launch.retry_delay"),
        ({"retry_delay": "1m", "max_retry_delay": "30s"}, "launch.max_retry_delay"),
        ({"retry_delay": "soon"}, "launch.retry_delay"),
        ({"retries": 3}, "launch"),
    ],
)
def test_bad_launch_settings_name_their_field(launch, field):
    with pytest.raises(ConfigError) as error:
        PolicySettings.from_dict({"launch": launch})
    assert field in str(error.value)


def test_a_job_backing_off_is_listed_apart_and_has_no_position():
    scheduler = Scheduler(cluster(("n1", 8, "leaf")), settings=SETTINGS)
    scheduler.submit(job("a", 4), 0)
    scheduler.schedule(0)
    _refuse(scheduler, "a", 1)
    scheduler.submit(job("b", 8, t=2), 2)
    assert "b" in started(scheduler.schedule(2))
    scheduler.submit(job("c", 4, t=3), 3)
    scheduler.schedule(3)
    assert scheduler.position("a") is None and scheduler.position("c") == 0
    assert [j.id for j in scheduler.retrying_jobs()] == ["a"]
    scheduler.job_ended("b", 5)
    assert set(started(scheduler.schedule(11))) == {"a", "c"}
    assert scheduler.retrying_jobs() == []


def test_refused_too_often_the_job_fails():
    settings = PolicySettings.from_dict({"launch": {"retry_delay": "1s", "max_refusals": 2}})
    scheduler = Scheduler(cluster(("n1", 8, "leaf")), settings=settings)
    scheduler.submit(job("a", 4), 0)
    t = 0.0
    for refusal in (1, 2, 3):
        assert "a" in started(scheduler.schedule(t))
        _refuse(scheduler, "a", t + 0.5)
        t += 10
        expected = JobState.FAILED if refusal == 3 else JobState.PENDING
        assert scheduler.jobs["a"].state == expected
    assert scheduler.retrying_jobs() == [] and len(scheduler.pending) == 0
    assert scheduler.state.free_total == 8


def test_a_refused_job_does_not_preempt():
    scheduler = Scheduler(cluster(("n1", 8, "leaf")), settings=SETTINGS)
    scheduler.submit(job("low", 8, tier=3), 0)
    scheduler.schedule(0)
    scheduler.submit(job("high", 8, t=1, tier=1), 1)
    scheduler.schedule(1)  # it pre-empts "low" ...
    scheduler.job_ended("low", 2, "preempted")
    assert "high" in started(scheduler.schedule(2))
    _refuse(scheduler, "high", 3)  # ... then its launch is refused
    assert "low" in started(scheduler.schedule(4))  # low is back (requeued) and runs
    decisions = scheduler.schedule(20)  # high's back-off is over: it waits, no pre-emption
    assert preempted(decisions) == [] and "high" not in started(decisions)
    assert scheduler.jobs["high"].state == JobState.PENDING
