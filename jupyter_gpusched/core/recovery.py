"""How a job that was running when the service went down comes back: plain rules, no I/O.

``service/recovery.py`` reads the store and asks the launcher what became of the job's processes,
then :func:`after_restart` says what the job is now, and the adapter writes that back:

* a batch job marked running that was never launched (no handle): it never ran, so it is
  pending again with the run it did not have taken back;
* a batch job being cancelled when the service went down: its cancel is finished (its
  processes killed if they still live);
* a batch job whose processes are gone: requeued if it was leaving after its pre-emption signal
  (one pre-emption more), else finished as its exit says (:func:`ended_state`);
* anything else (a notebook server, a batch job still running): put back into the engine as it
  was (:data:`RESTORE`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .jobs import Job, JobState

#: The events that say the service was stopping a running job when it went down.
INTERRUPTED_STOPS = ("preempted", "cancelling")


@dataclass(frozen=True)
class Requeue:
    """Pending again; ``changes``: the job's other fields that change (its runs, pre-emptions,
    start or end time); ``message``: the event's."""

    message: str
    changes: dict = field(default_factory=dict)


@dataclass(frozen=True)
class End:
    """Finished while the service was down (or now): ``cancelled`` when its interrupted cancel is
    finished, else its exit decides (:func:`ended_state`); ``kill``: its processes still live and
    must be killed first."""

    cancelled: bool = False
    kill: bool = False


@dataclass(frozen=True)
class Restore:
    """Still running: back into the engine on the GPUs it holds."""


RESTORE = Restore()


def interrupted_stop(latest_event: str | None) -> str | None:
    """``preempted`` or ``cancelling`` when that is the latest event of a running job: the
    service was stopping it when it went down."""
    return latest_event if latest_event in INTERRUPTED_STOPS else None


def after_restart(
    job: Job, *, launched: bool, stopping: str | None, alive: bool, now: float
) -> Requeue | End | Restore:
    """What becomes of ``job``, marked running in the store, at a restart at ``now``.
    ``launched``: it has a handle; ``stopping``: :func:`interrupted_stop`; ``alive``: its
    processes still run (asked of batch jobs with a handle only)."""
    if job.kind != "batch":
        return RESTORE  # a notebook server: the hub owns its process
    if not launched:  # marked running, but the service stopped before the launch
        return Requeue(
            "requeued: the service stopped before launching it",
            {"runs": job.runs - 1, "start_time": None},
        )
    if stopping == "cancelling":
        return End(cancelled=True, kill=alive)
    if alive:
        return RESTORE
    if stopping == "preempted":  # it left after its pre-emption signal
        return Requeue(
            "requeued after pre-emption", {"preemptions": job.preemptions + 1, "end_time": now}
        )
    return End()


def ended_state(end: End, exit_outcome: str | None) -> JobState:
    """The state a job that ended while the service was down finishes in: cancelled when its
    cancel was interrupted, completed when its exit says so, else failed."""
    if end.cancelled:
        return JobState.CANCELLED
    return JobState.COMPLETED if exit_outcome == "completed" else JobState.FAILED


def waiting_since(end_time: float | None, submit_time: float) -> float:
    """Since when a pending job put back in the queue has waited: its last requeue (the end of
    its last run), else its submission."""
    return end_time or submit_time
