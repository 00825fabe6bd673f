"""Cancelling a job array as one (``DELETE api/arrays/<id>``): every element of it that is still
pending or running.

Submitting one is :meth:`.submissions.Submissions.submit_array` (the elements enter the queue
and the database together); the cap on running elements is the engine's (core/arrays.py). Apart
from live.py because cancelling many pending jobs at once writes them in one transaction and runs
one pass, where :meth:`.live.LiveScheduler.cancel` (still used for the running elements, which
need their processes stopped) writes and passes per job.
"""

from __future__ import annotations

from ..core.jobs import Job, JobState
from .identity import Identity


def unfinished_elements(live, array_id: str, who: Identity) -> list[Job]:
    """The pending and running jobs of ``array_id`` that ``who`` may cancel (their own; an
    admin: anyone's), in index order. Unfinished jobs are all in memory: no query."""
    return sorted(
        (
            job
            for job in live.engine.jobs.values()
            if job.array_id == array_id
            and job.state in (JobState.PENDING, JobState.RUNNING)
            and (job.user == who.name or who.admin)
        ),
        key=lambda job: job.array_index,
    )


def cancel_array(live, jobs: list[Job], actor: str) -> None:
    """Cancel ``jobs`` (:func:`unfinished_elements`): the pending ones in one transaction, then
    the running ones as any cancel (their processes are signalled)."""
    live.submissions.save()  # the elements' own rows first (a cancel right after submitting)
    pending = [job for job in jobs if job.state == JobState.PENDING]
    now = live.clock()
    changes, events = [], []
    for job in pending:
        live.engine.cancel(job.id, now)
        fields, event = live.pending_cancelled(job, actor)
        changes.append((job.id, fields))
        events.append(event)
    if changes:
        live.store.apply(changes, [], [], events)
    for job in jobs:
        if job.state == JobState.RUNNING:
            live.cancel(job.id, actor)
    live.run_pass()
    for job in pending:  # after the pass, as live.cancel does
        live._forget(job)
