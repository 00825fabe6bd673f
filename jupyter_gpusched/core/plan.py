"""Expected starts for every pending job, not only the reservation's holder (``squeue --start``).

The engine gives an estimated start to one pending job: the first blocked one, whose reservation
says when the GPUs it needs free (:mod:`.reservation`). A job behind it has a reason ("needs 2
GPUs; 0 free") and no time. :func:`expected_starts` gives every pending job one by playing the
engine forward on a copy of its state (:func:`.copying.snapshot`): each running job ends when it
is expected to (its learned estimate, else its walltime or the policy default:
:func:`.runtime_estimates.expected_ends`), no job arrives, and each job that starts in the play
runs for its planned run time. Every pass in the play is the engine's own (priorities, quotas,
reservations, backfill, pre-emption), so a job's expected start is when the engine would start
it if the running jobs ran as planned.

It is an estimate, as Slurm's is: a job that ends before its walltime brings starts forward,
new jobs of higher priority push them back, and the live engine's reasons and decisions are not
changed by it. The play stops when every pending job has started, when nothing is left to end,
after ``horizon`` seconds or after ``max_ends`` job ends (its cost: about one pass per end); a
job it did not reach keeps no expected start. Held jobs and jobs waiting out a refused launch's
back-off have none either.
"""

from __future__ import annotations

import heapq

from .copying import snapshot
from .decisions import Preempt, Start, Stop
from .jobs import JobState
from .runtime_estimates import expected_ends

HORIZON_S = 30 * 86_400.0  # the play looks no further ahead than this
MAX_ENDS = 5_000  # job ends played at most (each is about one pass)
END, KILL, WAKE = 0, 1, 2  # a run's planned end, a pre-emption victim's, a wake-up


def expected_starts(
    sched, now: float, horizon: float = HORIZON_S, max_ends: int = MAX_ENDS
) -> dict[str, float]:
    """Job id -> expected start (engine time, ``now`` or later) of the pending jobs of ``sched``
    that the play reaches (see the module's text). ``sched`` is not changed."""
    return play(snapshot(sched), now, horizon, max_ends)


def play(
    trial, now: float, horizon: float = HORIZON_S, max_ends: int = MAX_ENDS, until=None
) -> dict[str, float]:
    """:func:`expected_starts` on ``trial``, a copy of the live scheduler (:func:`.copying.
    snapshot`) that the play changes: the service copies on its event loop and plays in a
    thread. ``until``: a job id; the play stops once that job has started."""
    waiting = {job.id for job in trial.jobs.values() if trial.waiting_in_line(job)}
    events = [  # (time, END, KILL or WAKE, job id, the run it ends): a heap
        (played_end(trial.jobs[job_id], end, now), END, job_id, trial.jobs[job_id].runs)
        for end, job_id in expected_ends(trial.ledger.ends, trial.jobs, now, trial.settings)
    ]
    for victim in trial.running.values():  # signalled to make room: gone after its grace
        if victim.preempted_by is not None:
            events.append((_leaves(trial, victim, now), KILL, victim.id, victim.runs))
    queued_ends = len(events)
    woken = trial.next_wakeup()  # (a pre-emption victim's minimum run time, a back-off ...)
    if woken is not None:
        events.append((max(woken, now), WAKE, "", 0))
    heapq.heapify(events)
    starts: dict[str, float] = {}
    played = 0
    while waiting and queued_ends and played < max_ends and until not in starts:
        moment = events[0][0]
        if moment > now + horizon:
            break
        while events and events[0][0] == moment:
            _, kind, job_id, run = heapq.heappop(events)
            queued_ends -= kind != WAKE
            job = trial.jobs.get(job_id)
            if kind != WAKE and job_id in trial.running and job.runs == run:
                trial.job_ended(job_id, moment, "completed" if kind == END else "preempted")
                played += 1
        for job_id, end, kind in _carry_out(trial, trial.schedule(moment), moment):
            heapq.heappush(events, (end, kind, job_id, trial.jobs[job_id].runs))
            queued_ends += 1
            if job_id in waiting and trial.jobs[job_id].state == JobState.RUNNING:
                waiting.discard(job_id)
                starts[job_id] = moment
        wake = trial.next_wakeup()
        if wake is not None and wake > moment and wake != woken:
            heapq.heappush(events, (wake, WAKE, "", 0))
            woken = wake
    # (the loop also ends when nothing that could end runs: what still waits then, waits on
    # more than GPUs, such as a drained node)
    return starts


def played_end(job, end: float, now: float) -> float:
    """When the play has a running job end: at ``end``, its expected end (corrected for a learned
    estimate it outran: :func:`.runtime_estimates.expected_ends`), or now if that has passed;
    but a job past its planned end that has no walltime (nothing stops it: a notebook server, a
    job planned with the policy's default) runs as long again as it has run. The engine's
    reservation takes such a job to end now, so that GPUs it holds are reserved; a start
    promised "now" for hours would not be an expected start."""
    planned = job.planned_run_time  # (frozen at submission: what ``end`` was planned from)
    overran = planned is not None and job.start_time + planned < now
    if job.walltime or not overran:
        return max(end, now)
    return max(now, job.start_time + 2 * (now - job.start_time))


def _leaves(trial, victim, now: float) -> float:
    """When a pre-emption victim signalled before ``now`` is killed: its claim's owner waits
    until then (its reason's eta: the signal's time and the longest grace of its victims)."""
    owner = trial.jobs.get(victim.preempted_by)
    eta = owner.reason.eta if owner is not None and owner.reason is not None else None
    return now if eta is None else max(eta, now)


def _carry_out(trial, decisions, moment: float):
    """(job id, when its run ends, END or KILL) for each decision of a pass: a started job ends
    after its planned run time, a pre-empted one is killed after its grace period (unless its
    run ends first), a cancelled one ends at once."""
    for decision in decisions:
        if isinstance(decision, Start):
            job = trial.jobs[decision.job_id]
            yield job.id, moment + trial.planned_run_time(job), END
        elif isinstance(decision, Preempt):
            yield decision.job_id, moment + decision.grace, KILL
        elif isinstance(decision, Stop) and not decision.ended:
            yield decision.job_id, moment, END
