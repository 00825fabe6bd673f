"""A pending job's reason as it reads now, between two deep passes.

After a job ends, a quick pass (:mod:`.passes`) walks the queue only up to the first blocked
job, which holds the reservation; the jobs behind it keep the reason the last deep pass gave
them until the next one, at most ``backfill.interval`` later (:mod:`.cadence`). Their "needs
2 GPUs; 0 free" may be out of date by then: GPUs were freed since. :func:`reason_now` is the
reason with the GPUs free now:

- fewer than the job asks: "needs 4 GPUs; 2 free", the count as it is now;
- as many as it asks or more: the job is behind the reservation, whose holder may need them;
  the next deep pass checks whether it can start before that job ("needs 2 GPUs; 2 free since
  the last backfill pass; the next one, within 12 s, checks whether it can start before job
  j-4").

A job waiting on its queue's quota (a GPU, CPU or memory limit, or the tier-1 guarantee) says
what its queue uses now: "queue research is at its limit of 8 GPUs (8 in use, ...)" once a job
submitted after it started there (a pass over new jobs does not look at it again), not the
"6 in use" of its last examination. Where the quota would now let it start, it keeps the
engine's reason until the pass that the freed GPUs bring. A job that waited on GPUs, on the
reservation or on placement, whose queue has since reached its limit, gets the quota's reason:
a pass looks at the quota first (a tour saw "reserved for job j-8" for 7 minutes while the
queue was full).

Other reasons are as the engine gave them. Nothing here changes a decision: the service shows
a job's reason through it (its queue and job views), and the engine's own reasons stay those
of its last pass.
"""

from __future__ import annotations

from . import reasons
from .admission import policy_block
from .jobs import Job, JobState, Reason

QUOTA_DETAILS = frozenset(
    ("queue-limit", "queue-cpu-limit", "queue-memory-limit", "tier1-guarantee")
)
# Reasons a pass gives only after the job's quota let it through (core/passes.py evaluate):
# where the quota blocks it now, the quota's reason is the one a pass would give. (Not a
# pre-emption's, whose claim its queue already counts, nor a launch's back-off.)
WOULD_CHECK_QUOTA_FIRST = frozenset(
    (
        *("gpus-busy", "cpus-busy", "node-down", "preempted", "preemption-dropped"),
        *("fragmented", "gang-shape", "constraints", "one-leaf", "reservation"),
    )
)


def reason_now(sched, job: Job, now: float) -> Reason | None:
    """``job``'s reason with its free-GPU count, or its queue's use, as they are at ``now`` (see
    the module's text); ``sched``: the :class:`~.scheduler.Scheduler`, read only."""
    reason = job.reason
    if reason is None or job.state != JobState.PENDING:
        return reason
    if reason.detail in QUOTA_DETAILS:
        return _quota_now(sched, job, reason)
    if reason.detail in WOULD_CHECK_QUOTA_FIRST and sched.policy.quotas:
        block = policy_block(job, sched.tree.get(job.queue), sched.policy.guarantees)
        if block is not None:  # its queue filled up since: a pass would say so first
            return block[0].with_eta(reason.eta)
    if reason.detail != "gpus-busy":
        return reason
    free = sched.state.free_for(job)
    if free == dict(reason.args).get("free"):
        return reason
    if free < job.amount - 1e-9:
        return reasons.GPUS_BUSY.reason(eta=reason.eta, gpus=job.amount, free=free)
    reservation = sched.reservation
    if reservation is None or reservation.job_id == job.id:
        return reason  # (a pass is about to run: the event that freed them has just come)
    return reasons.FREED_SINCE_BACKFILL.reason(
        eta=reason.eta,
        gpus=job.amount,
        free=free,
        within_s=max(1, round(sched.next_deep_pass() - now)),
        job=reservation.job_id,
    )


def _quota_now(sched, job: Job, reason: Reason) -> Reason:
    """The quota that keeps ``job`` waiting, with its queue's use now (the same reason where
    nothing changed, or where the quota would now let the job start)."""
    if not sched.policy.quotas:
        return reason
    block = policy_block(job, sched.tree.get(job.queue), sched.policy.guarantees)
    if block is None or block[0].args == reason.args:
        return reason
    return block[0].with_eta(reason.eta)
