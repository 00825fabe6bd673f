"""Persistence for the scheduler service: jobs, allocations, settings and the audit log.

The service keeps its working state in memory and writes every decision through a
:class:`Store` before acting on it, so that after a crash (even ``kill -9``) it can rebuild
that state from the database: :meth:`Store.unfinished_jobs` and :meth:`Store.open_allocations`.

Rows go in and come out as plain dicts keyed by column name (see ``models.py`` for the
columns); JSON columns hold Python lists and dicts. Unknown keys are rejected with a
``ValueError`` naming them, before anything is written.

Each public write method is one transaction: it all happens, or none of it does. The hot paths
(:meth:`Store.add_job`, :meth:`Store.update_job`, :meth:`Store.apply`) use SQLAlchemy Core
statements built once, not ORM sessions: a submission costs well under a millisecond on SQLite.

Backends: SQLite (``sqlite:///path``; the default) and PostgreSQL
(``postgresql+psycopg://user@host/db``). A SQLite file is the service's alone: created 0600 (or
made so when opened), and SQLite gives its ``-wal`` and ``-shm`` files the database file's mode
and owner; it holds every job's command and ``env`` (see docs/security.md).

The store is meant to be used from one thread (the tornado IO loop); its calls block briefly.

The schema is created and kept current by the Alembic migrations shipped in ``migrations/``:
opening a store upgrades the database to the latest revision (a no-op when it is there). How
the database is opened (the engine, SQLite's settings, the file's mode, the Alembic
configuration) is in :mod:`.database`.
"""

from __future__ import annotations

import time
from typing import Any

import sqlalchemy as sa
from alembic import command
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Connection

from jupyter_gpusched.service.database import (
    alembic_config,
    make_engine,
    make_sqlite_file_private,
    sqlite_file,
)
from jupyter_gpusched.service.models import (
    ALLOCATION_ROW,
    EVENT_ROW,
    JOB_ROW,
    allocations_table,
    events_table,
    history_table,
    jobs_table,
    settings_table,
)

UNFINISHED = ("pending", "running")
USAGE_KEYS = ("queue", "user", "gpu_model")


def _event_row(event: dict[str, Any], **fill: Any) -> dict[str, Any]:
    """An event row: ``time`` defaults to now, and ``fill`` (job_id, user) to what the caller
    knows, where the event does not say."""
    known = {key: value for key, value in fill.items() if value is not None}
    return EVENT_ROW.row({"time": time.time(), **known, **event})


class Store:
    """The scheduler's database. See the module docstring; one instance per service."""

    def __init__(self, url: str = "sqlite:///gpusched.sqlite", echo: bool = False) -> None:
        self.url = url
        path = sqlite_file(url)
        if path is not None:
            make_sqlite_file_private(path)
        self.engine = make_engine(url, echo=echo)
        j, a = jobs_table, allocations_table
        self._insert_job = j.insert()
        self._insert_allocation = a.insert()
        self._insert_event = events_table.insert()
        self._update_job = j.update().where(j.c.id == sa.bindparam("b_job_id"))
        self._close_allocation = (
            a.update()
            .where(a.c.job_id == sa.bindparam("b_job_id"))
            .where(a.c.run == sa.bindparam("b_run"))
            .where(a.c.end.is_(None))
            .values(end=sa.bindparam("b_end"))
        )
        self.upgrade()

    # -- schema --------------------------------------------------------------------------------

    def upgrade(self) -> None:
        """Bring the schema to the latest migration, in one transaction (no-op if it is there)."""
        cfg = alembic_config()
        script = ScriptDirectory.from_config(cfg)
        with self.engine.begin() as conn:
            current = set(MigrationContext.configure(conn).get_current_heads())
            if current == set(script.get_heads()):
                return
            known = {revision.revision for revision in script.walk_revisions()}
            unknown = sorted(current - known)
            if unknown:
                raise RuntimeError(
                    f"the database {self.engine.url!r} is at schema revision {unknown}, which "
                    "this version of jupyter_gpusched does not know (a newer version made it?)"
                )
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "head")

    def close(self) -> None:
        """Close all connections."""
        self.engine.dispose()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- jobs ----------------------------------------------------------------------------------

    def next_number(self) -> int:
        """The next free job number: 1 + the largest so far (1 for an empty database)."""
        with self.engine.connect() as conn:
            largest = conn.execute(sa.select(sa.func.max(jobs_table.c.number))).scalar()
        return (largest or 0) + 1

    def add_job(self, row: dict[str, Any], event: dict[str, Any] | None = None) -> None:
        """Insert one job, and its event (e.g. "submitted"), in one transaction. The event's
        ``job_id`` and ``user`` default to the job's."""
        self.add_jobs([row], [] if event is None else [_event_row(event, **_about(row))])

    def add_jobs(self, rows: list[dict[str, Any]], events: list[dict[str, Any]]) -> None:
        """Insert many jobs and events in one transaction (a group commit)."""
        full = [JOB_ROW.row(row) for row in rows]
        event_rows = [_event_row(event) for event in events]
        with self.engine.begin() as conn:
            if full:
                conn.execute(self._insert_job, full)
            if event_rows:
                conn.execute(self._insert_event, event_rows)

    def update_job(
        self, job_id: str, fields: dict[str, Any], event: dict[str, Any] | None = None
    ) -> None:
        """Change some columns of one job (and log ``event``, whose ``job_id`` defaults to
        ``job_id``) in one transaction. ``KeyError`` if there is no such job."""
        self.apply(
            [(job_id, fields)], [], [], [] if event is None else [{"job_id": job_id, **event}]
        )

    def apply(
        self,
        changes: list[tuple[str, dict[str, Any]]],
        allocations_open: list[dict[str, Any]],
        allocations_closed: list[tuple[str, int, float]],
        events: list[dict[str, Any]],
    ) -> None:
        """Write what one scheduling pass decided, in one transaction: job updates
        ``(job_id, fields)``, new allocation rows, allocations to close ``(job_id, run, end)``,
        and events. Everything is checked first (``ValueError``, nothing written); an update of
        a job that does not exist raises ``KeyError`` and a database error (e.g. an allocation
        for an unknown job: ``sqlalchemy.exc.IntegrityError``) propagates; either way the whole
        batch is rolled back."""
        merged: dict[str, dict[str, Any]] = {}  # one UPDATE per job, later fields winning
        for job_id, fields in changes:
            JOB_ROW.check(fields)
            if "id" in fields:
                raise ValueError("a job's id cannot be changed")
            merged.setdefault(job_id, {}).update(fields)
        groups: dict[tuple[str, ...], list[dict[str, Any]]] = {}  # same columns: one executemany
        for job_id, fields in merged.items():
            if fields:
                groups.setdefault(tuple(sorted(fields)), []).append({**fields, "b_job_id": job_id})
        new_allocations = [ALLOCATION_ROW.row(row) for row in allocations_open]
        closes = [{"b_job_id": j, "b_run": r, "b_end": e} for j, r, e in allocations_closed]
        event_rows = [_event_row(event) for event in events]
        with self.engine.begin() as conn:
            for params in groups.values():
                done = conn.execute(self._update_job, params).rowcount
                countable = len(params) == 1 or self.engine.dialect.supports_sane_multi_rowcount
                if countable and done != len(params):
                    found = self._existing(conn, [p["b_job_id"] for p in params])
                    missing = sorted({p["b_job_id"] for p in params} - found)
                    raise KeyError(f"no such job(s): {', '.join(missing)}")
            if new_allocations:
                conn.execute(self._insert_allocation, new_allocations)
            if closes:
                conn.execute(self._close_allocation, closes)
            if event_rows:
                conn.execute(self._insert_event, event_rows)

    @staticmethod
    def _existing(conn: Connection, job_ids: list[str]) -> set[str]:
        query = sa.select(jobs_table.c.id).where(jobs_table.c.id.in_(job_ids))
        return set(conn.execute(query).scalars())

    def get_job(self, job_id: str) -> dict[str, Any] | None:
        """One job's row, or None."""
        with self.engine.connect() as conn:
            row = conn.execute(jobs_table.select().where(jobs_table.c.id == job_id)).first()
        return None if row is None else dict(row._mapping)

    def jobs(
        self,
        states: list[str] | None = None,
        user: str | None = None,
        limit: int | None = None,
        offset: int = 0,
        newest_first: bool = False,
    ) -> list[dict[str, Any]]:
        """Jobs in submit (``number``) order, or the newest first (``GET api/jobs``),
        optionally only some states / one user's."""
        j = jobs_table
        query = j.select().order_by(j.c.number.desc() if newest_first else j.c.number)
        if states is not None:
            query = query.where(j.c.state.in_(states))
        if user is not None:
            query = query.where(j.c.user == user)
        if limit is not None or offset:
            query = query.limit(limit).offset(offset)
        with self.engine.connect() as conn:
            return [dict(row) for row in conn.execute(query).mappings()]

    def unfinished_jobs(self) -> list[dict[str, Any]]:
        """Pending and running jobs in submit order: what a restarted service picks up."""
        return self.jobs(states=list(UNFINISHED))

    def open_allocations(self, job_id: str | None = None) -> list[dict[str, Any]]:
        """Allocations not yet closed (all, or one job's), oldest first."""
        a = allocations_table
        query = a.select().where(a.c.end.is_(None)).order_by(a.c.id)
        if job_id is not None:
            query = query.where(a.c.job_id == job_id)
        with self.engine.connect() as conn:
            return [dict(row) for row in conn.execute(query).mappings()]

    def runs_since(self, since: float) -> list[tuple[str, float, float, float | None]]:
        """``(queue, gpus, start, end)`` of every allocation that ran after ``since`` (end is
        None while it runs): what fair share is rebuilt from after a restart."""
        a = allocations_table
        query = sa.select(a.c.queue, a.c.gpus, a.c.start, a.c.end).where(
            sa.or_(a.c.end.is_(None), a.c.end > since)
        )
        with self.engine.connect() as conn:
            return [tuple(row) for row in conn.execute(query).all()]

    def completed_runs(self, limit: int) -> list[dict[str, Any]]:
        """The last ``limit`` jobs that completed (by end time), oldest first, with what the
        engine's run-time estimates learn from them (core/runtime_estimates.py)."""
        j = jobs_table
        columns = (j.c.user, j.c.queue, j.c.kind, j.c.gpus, j.c.name, j.c.notebook, j.c.command)
        query = (
            sa.select(*columns, j.c.start_time, j.c.end_time)
            .where(j.c.state == "completed", j.c.preemptions == 0)
            .where(j.c.start_time.is_not(None), j.c.end_time.is_not(None))
            .order_by(j.c.end_time.desc(), j.c.number.desc())
            .limit(limit)
        )
        with self.engine.connect() as conn:
            return [dict(row) for row in conn.execute(query).mappings()][::-1]

    # -- usage ---------------------------------------------------------------------------------

    def usage(self, start: float, end: float, by: str = "queue") -> list[dict[str, Any]]:
        """GPU-hours used in ``[start, end)`` per queue, user or GPU model (``by``), sorted by
        key: for each allocation, the overlap of ``[alloc.start, alloc.end)`` with the period,
        times its ``gpus``. An open allocation counts as running up to ``end``."""
        if by not in USAGE_KEYS:
            raise ValueError(f"usage by {by!r}: expected one of {', '.join(USAGE_KEYS)}")
        a = allocations_table
        lo = sa.literal(float(start), sa.Double())
        hi = sa.literal(float(end), sa.Double())
        until = sa.case((a.c.end.is_(None), hi), (a.c.end > hi, hi), else_=a.c.end)
        since = sa.case((a.c.start < lo, lo), else_=a.c.start)
        key = a.c[by]
        query = (
            sa.select(key, sa.func.sum((until - since) * a.c.gpus))
            .where(a.c.start < hi, sa.or_(a.c.end.is_(None), a.c.end > lo))
            .group_by(key)
        )
        with self.engine.connect() as conn:
            rows = conn.execute(query).all()
        # sorted here, not in SQL: database collations differ
        return [{"key": k, "gpu_hours": (s or 0.0) / 3600.0} for k, s in sorted(rows)]

    # -- settings ------------------------------------------------------------------------------

    def get_setting(self, key: str, default: Any = None) -> Any:
        """The value stored under ``key``, or ``default``."""
        s = settings_table
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(s.c.value).where(s.c.key == key)).first()
        return default if row is None else row[0]

    def set_setting(
        self, key: str, value: Any, by: str | None = None, event: dict[str, Any] | None = None
    ) -> None:
        """Store ``value`` (anything JSON can hold) under ``key``, noting who and when; with
        ``event`` (e.g. "quota-changed") logged in the same transaction."""
        s = settings_table
        fields = {"value": value, "updated": time.time(), "updated_by": by}
        event_row = None if event is None else _event_row(event, actor=by)
        with self.engine.begin() as conn:
            done = conn.execute(s.update().where(s.c.key == key).values(**fields)).rowcount
            if not done:
                conn.execute(s.insert().values(key=key, **fields))
            if event_row is not None:
                conn.execute(self._insert_event, event_row)

    def settings(self) -> dict[str, Any]:
        """All settings, key -> value."""
        s = settings_table
        with self.engine.connect() as conn:
            return dict(conn.execute(sa.select(s.c.key, s.c.value).order_by(s.c.key)).all())

    # -- audit log -----------------------------------------------------------------------------

    def add_event(self, event: dict[str, Any]) -> None:
        """Log one event (``kind`` required; ``time`` defaults to now, ``message`` to "")."""
        row = _event_row(event)
        with self.engine.begin() as conn:
            conn.execute(self._insert_event, row)

    def events(
        self,
        since: float | None = None,
        until: float | None = None,
        kind: str | None = None,
        job_id: str | None = None,
        user: str | None = None,
        limit: int = 1000,
        before_id: int | None = None,
    ) -> list[dict[str, Any]]:
        """Events newest first (by ``id``, i.e. in the order they were logged), with ``time``
        in ``[since, until)``. For the next page pass ``before_id`` = the last id you got."""
        e = events_table
        query = e.select().order_by(e.c.id.desc()).limit(limit)
        for column, value in (("kind", kind), ("job_id", job_id), ("user", user)):
            if value is not None:
                query = query.where(e.c[column] == value)
        if since is not None:
            query = query.where(e.c.time >= since)
        if until is not None:
            query = query.where(e.c.time < until)
        if before_id is not None:
            query = query.where(e.c.id < before_id)
        with self.engine.connect() as conn:
            return [dict(row) for row in conn.execute(query).mappings()]

    # -- history (core/history.py's rows) -------------------------------------------------------

    def add_history(self, row: dict[str, Any], keep_after: float) -> None:
        """Record one history row (its ``time`` and the rest as data) and drop the rows from
        before ``keep_after`` (the retention), in one transaction."""
        h = history_table
        data = {key: value for key, value in row.items() if key != "time"}
        with self.engine.begin() as conn:
            conn.execute(h.insert().values(time=row["time"], data=data))
            conn.execute(h.delete().where(h.c.time < keep_after))

    def history(self, since: float, until: float, limit: int) -> list[dict[str, Any]]:
        """History rows with ``time`` in ``[since, until]``, oldest first: the newest
        ``limit`` of them when there are more."""
        h = history_table
        query = (
            sa.select(h.c.time, h.c.data)
            .where(h.c.time >= since, h.c.time <= until)
            .order_by(h.c.time.desc())
            .limit(limit)
        )
        with self.engine.connect() as conn:
            rows = conn.execute(query).all()
        return [{"time": time_, **data} for time_, data in reversed(rows)]


def _about(row: dict[str, Any]) -> dict[str, Any]:
    """What an event about the job ``row`` defaults to."""
    return {"job_id": row.get("id"), "user": row.get("user")}
