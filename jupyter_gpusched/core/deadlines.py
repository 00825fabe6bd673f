"""Deadlines: a job that must have finished by a given time.

A job's ``deadline`` (engine clock; the trace's seconds from its start) is when its result is
needed. The engine plans with the job's *planned run time* (its walltime, or what the engine
plans with when it gives none: :meth:`~.scheduler.Scheduler.planned_run_time`), so while it
waits:

- its **latest start** is ``deadline - planned run time``; its **slack** at ``now`` is
  ``latest start - now`` (for a running job, ``deadline - planned end``);
- it is **urgent** once its slack is at most ``deadlines.urgency`` times its planned run time
  (policy file; default 1: a 2 h job with a deadline becomes urgent 2 h before its latest
  start). Under the ``gpusched`` policy an urgent job goes ahead of every job of its tier
  that is not urgent, and urgent jobs go least slack first (their latest start, which does not
  change while they wait); an urgent job of tier 3 may reclaim its queue's guarantee as tier 2
  does (pre-empt tier-3 jobs, and tier-2 jobs that borrow from other queues, never beyond the
  guarantees: invariant 4). Before it is urgent it is ordered as any other job;
- it has **missed** its deadline when it is unfinished at the deadline: the engine says so once
  (:class:`~.decisions.DeadlineMissed`) and, per ``deadlines.on_miss``, leaves it (``keep``,
  the default) or cancels it (``cancel``).

The ``slurm`` baseline has Slurm's ``--deadline`` instead: no urgency; a pending job is
cancelled at its latest start (when it can no longer end in time), a running one is left.

At submission the adapter asks :func:`earliest_finish`: the job is tried on a copy of the
engine (:mod:`.estimate`, the pass a real submission gets); it finishes at the start that pass
gives it (now, or its reservation's start) plus its planned run time. A job that the pass
leaves behind another's reservation gets the start of a reservation made for it alone (as if it
were first in line, which an urgent job may become): an optimistic bound, so that only a
deadline that cannot be met whatever happens is refused.
"""

from __future__ import annotations

import dataclasses

from .jobs import Job, JobState
from .reservation import reserve


def latest_start(job: Job, run_time: float) -> float:
    """The last moment ``job`` can start and still finish by its deadline."""
    return job.deadline - run_time


def urgent_from(job: Job, run_time: float, urgency: float) -> float:
    """When a waiting ``job`` becomes urgent: its slack is then ``urgency`` x its run time."""
    return latest_start(job, run_time) - urgency * run_time


def earliest_finish(sched, job: Job, now: float) -> float | None:
    """The earliest ``job`` (not yet submitted to ``sched``) could finish if submitted at ``now``
    (None: it would be rejected: it can never run here). ``sched`` is not changed."""
    from .estimate import estimate  # (estimate imports the scheduler, which imports us)

    trial_job = dataclasses.replace(job, labels=dict(job.labels))
    run_time = sched.planned_run_time(trial_job)
    found = estimate(sched, trial_job, now)
    if found.rejected:
        return None
    if found.start_now:
        return now + run_time
    start = found.eta
    if start is None:  # behind another's reservation: the one it would have if it were first
        start = _alone(found.job, sched, now)
    return max(start, now) + run_time


def _alone(job: Job, sched, now: float) -> float:
    """The start of the reservation ``job`` would get were it the first blocked job."""
    if job.state != JobState.PENDING or not job.gpus:
        return now
    reservation = reserve(sched.state, job, sched.ledger.ends, sched.jobs, now)
    return now if reservation.start is None else reservation.start
