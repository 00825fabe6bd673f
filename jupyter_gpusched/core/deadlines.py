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

At submission the adapter asks :func:`.estimate.earliest_finish`: the job is tried on a copy of the
engine (:mod:`.estimate`, the pass a real submission gets); it finishes at the start that pass
gives it (now, or its reservation's start) plus its planned run time. A job that the pass
leaves behind another's reservation gets the start of a reservation made for it alone (as if it
were first in line, which an urgent job may become): an optimistic bound, so that only a
deadline that cannot be met whatever happens is refused.
"""

from __future__ import annotations

import heapq
import math

from .copying import copy_parts
from .decisions import DeadlineMissed
from .jobs import Job, JobState


def latest_start(job: Job, run_time: float) -> float:
    """The last moment ``job`` can start and still finish by its deadline."""
    return job.deadline - run_time


def urgent_from(job: Job, run_time: float, urgency: float) -> float:
    """When a waiting ``job`` becomes urgent: its slack is then ``urgency`` x its run time."""
    return latest_start(job, run_time) - urgency * run_time


URGENT, LATEST_START, DEADLINE = "urgent", "latest-start", "deadline"
_ORDER = {URGENT: 0, LATEST_START: 1, DEADLINE: 2}


class DeadlineWatch:
    """The moments the engine must look at a job with a deadline, soonest first: when it becomes
    urgent (policy ``urgency``), its latest start (``slurm``: cancelled then if still pending)
    and its deadline (a miss if it is unfinished). A collaborator of the
    :class:`~.scheduler.Scheduler`, which acts on what :meth:`due` hands it."""

    def __init__(self, mode: str, urgency: float):
        self.mode, self.urgency = mode, urgency
        self.events: list[tuple[float, int, str]] = []  # heap of (time, kind order, job id)

    def __deepcopy__(self, memo):  # (core/copying.py: the events are tuples)
        return copy_parts(self, memo, flat=("events",))

    def watch(self, job: Job, run_time: float, now: float) -> None:
        """Note the moments of a job just submitted (nothing for a job without a deadline); one
        already urgent at ``now`` is made urgent by the scheduler at once."""
        if job.deadline is None:
            return
        if self.mode == "urgency" and urgent_from(job, run_time, self.urgency) > now:
            self._add(urgent_from(job, run_time, self.urgency), URGENT, job.id)
        elif self.mode == "slurm":
            self._add(latest_start(job, run_time), LATEST_START, job.id)
        self._add(job.deadline, DEADLINE, job.id)

    def _add(self, when: float, kind: str, job_id: str) -> None:
        heapq.heappush(self.events, (when, _ORDER[kind], job_id))

    def next_time(self) -> float:
        return self.events[0][0] if self.events else math.inf

    def due(self, now: float) -> list[tuple[str, str]]:
        """The (kind, job id) whose moment has come by ``now``, in time order."""
        found = []
        while self.events and self.events[0][0] <= now:
            _, order, job_id = heapq.heappop(self.events)
            found.append((_KINDS[order], job_id))
        return found


_KINDS = {order: kind for kind, order in _ORDER.items()}


# -- what the scheduler does at those moments (functions of the scheduler, as .passes) ----------
def watch(sched, job: Job, now: float) -> None:
    """``job``, with a deadline, has just been submitted to ``sched``."""
    run_time = sched.planned_run_time(job)
    watch_ = sched.deadlines
    if watch_.mode == "urgency" and urgent_from(job, run_time, watch_.urgency) <= now:
        sched.priorities.make_urgent(job.id, latest_start(job, run_time))
    watch_.watch(job, run_time, now)
    sched.agenda.wake_at(watch_.next_time())


def act(sched, now: float) -> None:
    """Act on the moments that have come: a job turns urgent (the order changes), reaches its
    latest start (``slurm``: cancelled if still pending) or its deadline (a miss)."""
    reordered = False
    for kind, job_id in sched.deadlines.due(now):
        job = sched.jobs.get(job_id)
        if job is None or job.state.finished or job.deadline_missed:
            continue
        if kind == URGENT:
            run_time = sched.planned_run_time(job)
            queued = sched.waiting_in_line(job)  # in the pending lists: moves to its own
            if queued:
                sched.pending.remove(job, run_time)
            sched.priorities.make_urgent(job_id, latest_start(job, run_time))
            if queued:
                sched.pending.add(job, run_time)
            reordered = True
        elif kind == LATEST_START and job.state == JobState.PENDING:
            _missed(sched, job, now, cancel=True)
        elif kind == DEADLINE:
            cancel = sched.deadlines.mode == "urgency" and sched.settings.deadline_on_miss
            _missed(sched, job, now, cancel=cancel == "cancel")
    if reordered:
        sched.pending.refresh()
    sched.agenda.wake_at(sched.deadlines.next_time())


def _missed(sched, job: Job, now: float, cancel: bool) -> None:
    job.deadline_missed = True
    action = "cancelled" if cancel else "kept"
    sched.agenda.decisions.append(DeadlineMissed(job.id, job.deadline, action))
    if cancel:
        sched.cancel(job.id, now, "deadline missed")
