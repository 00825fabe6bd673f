"""What ``GET api/export`` answers (admins only): the service's own history as a trace, for
``jupyter gpusched export-trace`` to write and ``replay`` / ``reaper what-if`` to read.

For each job that ran in the period (batch jobs and notebook servers; ``queue``: only that queue
and those below it): its request as the trace format's columns (core/jobspec.py's trace fields),
its ``duration`` (the work it needed: :func:`work`), and what happened to it, the *recorded*
columns: first start, end of its last run, the time it held GPUs over all its runs, its
pre-emptions, how it ended (``culled`` where the idle reaper stopped it), and a notebook's hub
profile. Times are epoch seconds; the command makes them seconds from the trace's start. Jobs
that never started are left out (a replay has no cancellation) and counted. Notebook servers
come with their GPU utilization over time, the runs the service recorded
(service/utilization_record.py).

The queue document and the idle reaper's settings in force come with them: what a replay and
the idle-timeout what-if start from.

``pseudonymize``: every user name (the ``user`` column, a queue path's part named like a user,
the queue document's ``users`` lists and ``user_limits``, the reaper's ``exempt_users``)
becomes a pseudonym that is the same in every export of this service and cannot be turned back
without the service's key: an HMAC of the name under a random key the service keeps in its
database (setting ``export_pseudonym_key``), never exported.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from typing import Any

import sqlalchemy as sa

from ..core.jobspec import TRACE_FIELDS
from ..core.settings import PolicySettings
from .models import allocations_table, events_table, jobs_table
from .utilization_record import utilization_runs

MAX_EXPORT_SPAN = 366 * 86400.0  # seconds one export may cover
MAX_EXPORT_JOBS = 100_000  # jobs in one answer; more: a 400 asking for a shorter period
MAX_EXPORT_RUNS = 1_000_000  # utilization runs in one answer
KEY_SETTING = "export_pseudonym_key"
OUTCOMES = ("completed", "failed", "cancelled", "preempted", "culled", "running")
UNFINISHED = ("pending", "running")  # a job that started and is pending is waiting again


class ExportTooLarge(ValueError):
    """More rows than one answer holds (the message says how many and what to narrow)."""


def pseudonym(key: str, name: str) -> str:
    """A stable pseudonym of the user ``name``: ``user-`` and 12 hex digits of an HMAC."""
    digest = hmac.new(key.encode(), name.encode(), hashlib.sha256).hexdigest()
    return f"user-{digest[:12]}"


def pseudonym_key(store) -> str:
    """The service's pseudonym key, made (and stored) on first use."""
    key = store.get_setting(KEY_SETTING)
    if not key:
        key = secrets.token_hex(32)
        store.set_setting(KEY_SETTING, key, by="service")
    return key


def _in_queue(column, queue: str | None):
    if not queue:
        return sa.true()
    literal = queue.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return sa.or_(column == queue, column.like(literal + "/%", escape="\\"))


def export(
    store,
    since: float,
    until: float,
    queue: str | None,
    key: str | None,
    quota_document,
    settings: PolicySettings,
    reaper_settings: dict | None = None,
) -> dict[str, Any]:
    """The answer of ``GET api/export`` (see the module docstring), user names pseudonymized
    under ``key`` when one is given (the service's: :func:`pseudonym_key`); :class:`ExportTooLarge`
    when the period holds more than one answer may. It only reads: a thread may run it."""
    j, a, e = jobs_table, allocations_table, events_table
    started = sa.and_(
        j.c.first_start.is_not(None),
        j.c.first_start <= until,
        sa.or_(j.c.state.in_(UNFINISHED), j.c.end_time.is_(None), j.c.end_time >= since),
        _in_queue(j.c.queue, queue),
    )
    never = sa.and_(j.c.first_start.is_(None), j.c.submit_time <= until, j.c.submit_time >= since)
    with store.engine.connect() as conn:
        count = conn.execute(sa.select(sa.func.count()).where(started)).scalar() or 0
        if count > MAX_EXPORT_JOBS:
            raise ExportTooLarge(
                f"{count:,} jobs ran in this period; one export holds at most "
                f"{MAX_EXPORT_JOBS:,}: give a shorter period (since, until) or a queue"
            )
        rows = [
            dict(r) for r in conn.execute(j.select().where(started).order_by(j.c.number)).mappings()
        ]
        left_out = conn.execute(
            sa.select(sa.func.count()).where(never, _in_queue(j.c.queue, queue))
        ).scalar()
        ids = [row["id"] for row in rows]
        runs_of: dict[str, list[float]] = {}  # job id -> the length of each run, in order
        culled: set[str] = set()
        for chunk in range(0, len(ids), 500):
            part = ids[chunk : chunk + 500]
            runs = (
                sa.select(a.c.job_id, a.c.run, sa.func.min(a.c.start), sa.func.max(a.c.end))
                .where(a.c.job_id.in_(part))
                .group_by(a.c.job_id, a.c.run)
            )
            for job_id, _run, start, end in conn.execute(runs.order_by(a.c.job_id, a.c.run)):
                runs_of.setdefault(job_id, []).append(max(0.0, (end or until) - start))
            culls = sa.select(e.c.job_id).where(e.c.kind == "reaper-cull", e.c.job_id.in_(part))
            culled.update(conn.execute(culls).scalars())
    notebooks = [row["id"] for row in rows if row["kind"] == "notebook"]
    runs = utilization_runs(store.engine, notebooks)
    if len(runs) > MAX_EXPORT_RUNS:
        raise ExportTooLarge(
            f"{len(runs):,} utilization runs in this period; one export holds at most "
            f"{MAX_EXPORT_RUNS:,}: give a shorter period (since, until) or a queue"
        )
    jobs = [_job(row, runs_of.get(row["id"], []), row["id"] in culled, settings) for row in rows]
    document, reaper = quota_document, reaper_settings
    pseudonymize = key is not None
    if pseudonymize:
        names = {job["user"] for job in jobs} | _document_users(quota_document)
        names |= set((reaper_settings or {}).get("exempt_users") or ())
        rename = {name: pseudonym(key, name) for name in names if name}
        for job in jobs:
            job["user"] = rename.get(job["user"], job["user"])
            job["queue"] = _renamed_path(job["queue"], rename)
        document = _renamed_document(quota_document, rename)
        if reaper is not None:
            exempt = sorted(rename.get(u, u) for u in reaper.get("exempt_users") or ())
            reaper = {**reaper, "exempt_users": exempt}
    return {
        "since": since,
        "until": until,
        "queue": queue,
        "pseudonymized": pseudonymize,
        "jobs": jobs,
        "utilization": runs,
        "left_out": {"never started": left_out or 0},
        "queues": document,
        "reaper": reaper,
    }


def work(runs: list[float], settings: PolicySettings) -> float:
    """The work a job needed, from the lengths of its runs: its last run, and what the runs
    before it (each ended by a pre-emption or a refused launch) kept by the ``checkpoint``
    model. A replay needs this as the job's ``duration``: the time it held GPUs over all its
    runs counts lost work twice."""
    if not runs:
        return 0.0
    return runs[-1] + sum(settings.saved_work(ran) for ran in runs[:-1])


def _job(row: dict, runs: list[float], culled: bool, settings: PolicySettings) -> dict[str, Any]:
    """One job's export record: the trace columns of its request, then what happened."""
    record: dict[str, Any] = {
        "job_id": row["id"],
        "submit_time": row["submit_time"],
        "duration": work(runs, settings),
    }
    for spec_field in TRACE_FIELDS:
        record[spec_field.wire] = row[spec_field.column_name]
    # unfinished at the export: running, or waiting again after a pre-emption (its end_time is
    # then its last run's, not an end)
    unfinished = row["state"] in UNFINISHED or row["end_time"] is None
    outcome = "running" if unfinished else "culled" if culled else row["state"]
    record.update(
        start_time=row["first_start"],
        end_time=None if unfinished else row["end_time"],
        run_time=sum(runs),
        preemptions=row["preemptions"],
        outcome=outcome,
        profile=row["profile"] if row["kind"] == "notebook" else None,
    )
    return record


def _document_users(document) -> set[str]:
    """The user names a queue document mentions (``users`` lists, ``user_limits`` keys)."""
    names: set[str] = set()
    if not isinstance(document, dict):
        return names
    names.update(k for k in (document.get("user_limits") or {}) if k != "default")

    def walk(queues):
        for spec in (queues or {}).values():
            if isinstance(spec, dict):
                names.update(str(u) for u in spec.get("users") or ())
                walk(spec.get("children"))

    walk(document.get("queues"))
    return names


def _renamed_path(path: str, rename: dict[str, str]) -> str:
    return "/".join(rename.get(part, part) for part in path.split("/")) if path else path


def _renamed_document(document, rename: dict[str, str]):
    """The queue document with every user name replaced (queue names named like users too)."""
    if not isinstance(document, dict):
        return document

    def queues(tree):
        out = {}
        for name, spec in (tree or {}).items():
            if isinstance(spec, dict):
                spec = dict(spec)
                if "users" in spec:
                    spec["users"] = [rename.get(str(u), u) for u in spec["users"] or ()]
                if "children" in spec:
                    spec["children"] = queues(spec["children"])
            out[rename.get(name, name)] = spec
        return out

    renamed = dict(document)
    if "queues" in renamed:
        renamed["queues"] = queues(renamed["queues"])
    if isinstance(renamed.get("user_limits"), dict):
        renamed["user_limits"] = {rename.get(k, k): v for k, v in renamed["user_limits"].items()}
    if isinstance(renamed.get("default_queue"), str):
        renamed["default_queue"] = _renamed_path(renamed["default_queue"], rename)
    return renamed
