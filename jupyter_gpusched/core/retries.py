"""Launches the backend refused: the job goes back to pending and is retried after a back-off.

The engine chose a placement, but the launcher could not carry it out (Slurm's ``sbatch``
refused the nodes, or Slurm kept the job pending for a reason it cannot get over). That says
the cluster file and the backend disagree, not that the job is bad, so a batch job is never
failed for it: it goes back to pending, keeps its place in the queue (submit time), and waits
``launch.retry_delay`` before it is considered again, doubled at each refusal in a row up to
``launch.max_retry_delay`` (without the wait it would be placed on the same nodes at once).
Its reason says why and when it is retried. After ``launch.max_refusals`` refusals in a row it
fails with the launcher's message: a refusal that lasts is about the job or its user (no Slurm
account, a QOS or partition limit), not a passing disagreement. A job that was refused does not
pre-empt others (each retry would stop them again). A notebook job fails at once: the spawner
that asked for it reports the error to its user.

:class:`LaunchRetries` keeps the jobs backing off; the :class:`~.scheduler.Scheduler` gives it
the settings, hands it each refused batch job and, when it wakes, takes back the jobs that are
due and puts them in the queue.
"""

from __future__ import annotations

import math
import time

from . import reasons
from .jobs import Job, JobState, Reason
from .settings import PolicySettings


class LaunchRetries:
    def __init__(self, settings: PolicySettings):
        self.settings = settings
        self.backing_off: dict[str, Job] = {}  # job id -> the job, until its retry is due

    def back_off(self, job: Job, now: float, message: str) -> Reason | None:
        """``job`` just ended with outcome ``refused``: back to pending, out of the queue until
        its ``retry_at``, with the returned reason; or failed (None) after too many refusals."""
        job.refusals += 1
        if job.refusals > self.settings.launch_max_refusals:  # not a passing disagreement
            job.state = JobState.FAILED
            return None
        delay = min(
            self.settings.launch_retry_delay * 2 ** (job.refusals - 1),
            self.settings.launch_max_retry_delay,
        )
        job.state = JobState.PENDING
        job.pending_since = job.end_time
        job.one_leaf_since = None
        job.retry_at = now + delay
        self.backing_off[job.id] = job
        when = time.strftime("%H:%M:%S", time.gmtime(job.retry_at))
        return reasons.LAUNCH_REFUSED.reason(
            job.retry_at, message=message, when=when, refusals=job.refusals
        )

    def waiting(self) -> list[Job]:
        """Pending jobs waiting out a back-off (not in the queue's order until then), soonest
        retry first."""
        jobs = [
            job
            for job in self.backing_off.values()
            if job.state == JobState.PENDING and not job.held and job.retry_at is not None
        ]
        return sorted(jobs, key=lambda job: (job.retry_at, job.id))

    def due(self, now: float) -> tuple[list[Job], float]:
        """The jobs whose back-off is over (``retry_at`` cleared: they go back in the queue),
        and when the next one is due (inf: none)."""
        ready, later = [], math.inf
        for job_id, job in list(self.backing_off.items()):
            if job.state != JobState.PENDING or job.retry_at is None:
                del self.backing_off[job_id]  # cancelled, or released by an admin
            elif job.held:
                continue  # an admin's release puts it back
            elif job.retry_at <= now:
                del self.backing_off[job_id]
                job.retry_at = None
                ready.append(job)
            else:
                later = min(later, job.retry_at)
        return ready, later
