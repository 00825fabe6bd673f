"""Deadlines, live (core/deadlines.py has the terms): the check a submission with a
``deadline`` gets, and what the service does when the engine says a job missed its deadline.

- **At submission** (``POST api/jobs``, ``POST api/estimate``; :func:`earliest_finish_or_refuse`):
  the job is tried on a copy of the engine (:func:`~..core.estimate.earliest_finish`, the cost
  of one snapshot, paid only by jobs with a deadline); a deadline before the earliest finish is
  a 400 on ``deadline`` that gives that finish (UTC) and the walltime it was planned with, and
  nothing is queued. A job array's elements share one deadline: its first element is checked
  (the others would start no earlier, so a deadline the first cannot meet, none can).
- **On a miss** (:class:`~..core.decisions.DeadlineMissed`; :func:`carry_out_miss`): an audit
  event ``deadline-missed`` with the action (``kept`` or ``cancelled``), the counter
  ``gpusched_deadline_misses_total{action}``, the job's ``deadline_missed`` flag (stored: a
  restart does not report it again), and, for a pending job the engine cancelled, the job's
  message; a running one it cancels is stopped through the engine's ``Stop`` as a user's
  cancel is, its message saying why. A pending job's reason stays its one reason (invariant 6):
  the miss is a flag beside it.
"""

from __future__ import annotations

import dataclasses
import math
from datetime import datetime, timezone

from ..core.decisions import DeadlineMissed
from ..core.durations import describe_duration
from ..core.errors import ConfigError
from ..core.estimate import earliest_finish
from ..core.jobs import Job, JobState
from .request_values import RequestError


def utc_text(epoch: float) -> str:
    """An epoch as the messages give times: ISO 8601 in UTC to the second, ``...Z``."""
    moment = datetime.fromtimestamp(math.ceil(epoch), timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def earliest_finish_or_refuse(engine, job: Job) -> float | None:
    """The earliest ``job`` (not submitted yet; its ``submit_time`` is now) can finish, for a
    job with a deadline (None without one, or when the engine would reject it anyway: its own
    400 follows); a RequestError on ``deadline`` when that is after its deadline."""
    if job.deadline is None:
        return None
    now = job.submit_time
    try:
        finish = earliest_finish(engine, job, now)
    except ConfigError as exc:
        raise RequestError(exc.message, exc.field) from None
    if finish is None or finish <= job.deadline:
        return finish
    trial = dataclasses.replace(job, labels=dict(job.labels))  # (the engine freezes its plan)
    run_time = engine.planned_run_time(trial)
    if trial.estimated:  # a learned estimate (core/runtime_estimates.py)
        planned = f"a run time of {describe_duration(run_time)} estimated from runs like it"
    elif job.walltime:
        planned = describe_duration(run_time)
        planned = f"walltime {planned} (give a shorter walltime if it runs less)"
    else:
        planned = (
            f"no walltime, planned as the default {describe_duration(run_time)} (give a "
            "walltime if it runs less)"
        )
    start = finish - run_time
    waits = f" (it would start at {utc_text(start)} at the earliest)" if start > now + 1 else ""
    raise RequestError(
        f"'deadline' {utc_text(job.deadline)} cannot be met: with {planned}, the earliest this "
        f"job can finish is {utc_text(finish)}{waits}; give a deadline of {utc_text(finish)} or "
        "later",
        "deadline",
    )


def carry_out_miss(live, job: Job, decision: DeadlineMissed) -> dict:
    """What the service does about ``decision`` (see the module's docstring) but writing: the
    event to write with the pass's rows. A running job is still RUNNING here (its ``Stop``,
    if it is cancelled, is carried out with the pass); a pending one the engine cancelled is
    CANCELLED already."""
    job.deadline_missed = True  # (the engine's own flag; set here too should it not be)
    was_running = job.state == JobState.RUNNING
    extra = live.extras.get(job.id)
    when = utc_text(decision.deadline)
    if decision.action == "cancelled" and not was_running:
        message = f"cancelled: it could no longer finish by its deadline {when}"
        if extra is not None:
            extra.message = message
        live.submissions.count_pending(job, -1)
        live._forget_later[job.id] = job  # after one more pass (as LiveScheduler.cancel)
        live._again = True
    elif decision.action == "cancelled":
        message = f"deadline {when} missed: stopping it (the policy cancels jobs that miss)"
        live._stop_reasons[job.id] = f"cancelled: its deadline {when} passed while it ran"
    else:
        state = "running" if was_running else "pending"
        message = f"deadline {when} missed; it stays {state} (the policy keeps jobs that miss)"
    if live.metrics is not None:
        live.metrics.deadline_missed(decision.action)
    event = live._event("deadline-missed", job, None, message)
    event["data"] = {"deadline": decision.deadline, "action": decision.action}
    return event
