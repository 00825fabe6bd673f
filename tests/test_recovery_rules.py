"""core/recovery.py: what becomes of a job the store says was running, at a restart (the rules
service/recovery.py applies; tests/test_service_restart.py checks them through a real service)."""

from __future__ import annotations

from helpers import job

from jupyter_gpusched.core.jobs import JobState
from jupyter_gpusched.core.recovery import (
    RESTORE,
    End,
    Requeue,
    after_restart,
    ended_state,
    interrupted_stop,
    waiting_since,
)

NOW = 500.0


def running(kind="batch", runs=2, preemptions=1):
    return job("j", 1, kind=kind, runs=runs, preemptions=preemptions, start_time=100.0)


def comeback(j, launched=True, stopping=None, alive=False):
    return after_restart(j, launched=launched, stopping=stopping, alive=alive, now=NOW)


def test_a_batch_job_never_launched_is_pending_again_its_run_taken_back():
    assert comeback(running(), launched=False, stopping="cancelling") == Requeue(
        "requeued: the service stopped before launching it", {"runs": 1, "start_time": None}
    )


def test_an_interrupted_cancel_is_finished_killing_what_still_lives():
    assert comeback(running(), stopping="cancelling", alive=True) == End(cancelled=True, kill=True)
    assert comeback(running(), stopping="cancelling") == End(cancelled=True, kill=False)
    assert ended_state(End(cancelled=True), "completed") == JobState.CANCELLED


def test_a_preempted_job_that_left_is_requeued_one_preemption_more():
    assert comeback(running(), stopping="preempted") == Requeue(
        "requeued after pre-emption", {"preemptions": 2, "end_time": NOW}
    )
    # still alive after its signal: it is put back, the engine finishes the pre-emption
    assert comeback(running(), stopping="preempted", alive=True) is RESTORE


def test_a_job_gone_while_down_ends_as_its_exit_says():
    assert comeback(running()) == End()
    assert ended_state(End(), "completed") == JobState.COMPLETED
    assert ended_state(End(), "lost") == JobState.FAILED
    assert ended_state(End(), None) == JobState.FAILED


def test_notebooks_and_live_batch_jobs_are_restored():
    assert comeback(running(kind="notebook"), launched=False, stopping="cancelling") is RESTORE
    assert comeback(running(), alive=True) is RESTORE


def test_only_a_stop_in_progress_counts_and_requeued_jobs_wait_since_their_requeue():
    assert [interrupted_stop(k) for k in ("preempted", "cancelling", "started", None)] == [
        "preempted",
        "cancelling",
        None,
        None,
    ]
    assert waiting_since(300.0, 10.0) == 300.0
    assert waiting_since(None, 10.0) == 10.0
