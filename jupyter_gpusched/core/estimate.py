""" "When would I start?": a job not yet queued, submitted to a copy of the engine.

:func:`estimate` answers for a job the way the engine itself would: the job is submitted to a
copy of the scheduler and one pass runs at ``now`` (the pass a real submission gets). If it
started, it starts now; if not, its reason is the one the pass gave it, and its estimated start
is its expected start (:mod:`.plan`: the engine played forward on the copy, at most
:data:`ESTIMATE_MAX_ENDS` job ends ahead; farther, none), or, when it is the first blocked job,
the start of the reservation the pass made for it (:mod:`.reservation`) if the play does not
start it sooner (the reservation counts only running jobs' ends; the play also pre-empts,
e.g. reclaims GPUs another queue borrows once their minimum run time is over). So there
is one estimator, the engine's: an estimate is what the job's record would say right after a
submission, and its expected start what the queue would then show.

The live scheduler is not touched: no event, no job number, no fair-share or priority change.
The copy is a deep copy of everything a pass may change (jobs pending and running, the cluster's
state, the queue tree's usage, the ledger, the claims ...), sharing only what no pass changes:
the cluster's description, the settings and the policy (all read only; the settings and policy
are frozen dataclasses). The live service keeps only unfinished jobs in the engine, so the copy
grows with the pending and running jobs, not with history (benchmarks/bench_estimate.py measures
it).
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass

from .copying import snapshot
from .jobs import Job, JobState, Reason
from .plan import HORIZON_S, play
from .reservation import reserve
from .runtime_estimates import expected_ends
from .scheduler import Scheduler

ESTIMATE_MAX_ENDS = 50  # job ends an estimate plays ahead at most (each costs about a pass)


@dataclass(frozen=True)
class Estimate:
    """What a job submitted now would meet. ``rejected``: it can never run here (the job's
    ``reject_reason`` and ``reject_field`` say why, as a submission's would); ``position``:
    1-based, where it would stand in the pending order (None when it starts or is rejected)."""

    job: Job  # the copy's job, after the pass
    start_now: bool
    eta: float | None
    reason: Reason | None
    position: int | None

    @property
    def rejected(self) -> bool:
        return self.job.state == JobState.REJECTED


def estimate(sched: Scheduler, job: Job, now: float, expected: bool = True) -> Estimate:
    """Submit ``job`` (not in ``sched``: its id must be new) to a copy of ``sched`` and run the
    pass a submission gets at ``now``; what that pass decided for it, with its expected start
    where the reservation gives none (``expected``; see the module's text). ``sched`` is
    unchanged."""
    if job.id in sched.jobs:
        raise ValueError(f"job {job.id!r} is already in the scheduler")
    trial = snapshot(sched)
    trial.submit(job, now)
    if job.state == JobState.REJECTED:
        return Estimate(job, False, None, None, None)
    trial.schedule(now)
    started = job.state == JobState.RUNNING
    reason = None if started else job.reason
    eta = reason.eta if reason is not None else None
    ahead = trial.position(job.id)
    position = None if ahead is None else ahead + 1
    answered = job
    if reason is not None and expected:
        answered = copy.copy(job)  # as this pass left it: the play goes on changing the job
        # (the reservation's holder: played up to its reservation's start, no further)
        horizon = HORIZON_S if eta is None else max(0.0, eta - now)
        played = play(trial, now, horizon, ESTIMATE_MAX_ENDS, until=job.id).get(job.id)
        if played is not None and (eta is None or played < eta):
            if eta is not None:  # sooner than its reservation (by pre-emption, which that
                reason = reason.with_eta(played)  # ignores): the answer says one time
            eta = played
    return Estimate(answered, started, eta, reason, position)


def earliest_finish(sched, job: Job, now: float) -> float | None:
    """The earliest ``job`` (not yet submitted to ``sched``) could finish if submitted at ``now``
    (None: it would be rejected: it can never run here): the check of a job's deadline at
    submission (:mod:`.deadlines`). ``sched`` is not changed."""
    trial_job = dataclasses.replace(job, labels=dict(job.labels))
    run_time = sched.planned_run_time(trial_job)
    found = estimate(sched, trial_job, now, expected=False)
    if found.rejected:
        return None
    if found.start_now:
        return now + run_time
    # the reservation it would have were it first in line, with the running jobs ending as
    # expected (their learned estimates, where the engine's reservation plans with limits)
    start = _alone(found.job, sched, now)
    if found.eta is not None:
        start = min(start, found.eta)
    return max(start, now) + run_time


def _alone(job: Job, sched, now: float) -> float:
    """The start of the reservation ``job`` would get were it the first blocked job and the
    running jobs ended as expected (:func:`.runtime_estimates.expected_ends`)."""
    if job.state != JobState.PENDING or not job.gpus:
        return now
    ends = expected_ends(sched.ledger.ends, sched.jobs, now, sched.settings)
    reservation = reserve(sched.state, job, ends, sched.jobs, now)
    return now if reservation.start is None else reservation.start
