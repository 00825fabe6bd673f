"""The scheduler service's database schema, as SQLAlchemy 2 declarative models.

Six tables hold everything that must survive a crash of the service:

``jobs``
    One row per job: the request (user, queue, tier, GPUs, ...) and where the scheduler has got
    with it (state, reason, times, the launcher's handle for the current run).
``allocations``
    One row per run of a job on a node (a gang job spanning three nodes has three rows per run).
    Closed rows (``end`` set) are also the usage history: GPU-hours over a period are the
    overlap of these intervals with the period, times ``gpus``.
``settings``
    Key -> JSON value: quota overrides, reaper settings, per-user limits, drained nodes, ...
``events``
    The audit log: who did what to which job or node, and when.
``history``
    The cluster every ``history_interval`` seconds (GPUs by tier and queue, pending GPUs by
    reason family, measured utilization: core/history.py), kept ``history_retention_days``.
``utilization_runs``
    Each notebook server's GPU utilization over time as the service measured it, in runs of
    samples within one band (core/utilization_bands.py), kept ``utilization_retention_days``:
    what ``export-trace`` exports for the idle-timeout what-if.

Times are float epoch seconds (``time.time()``) throughout. JSON columns hold plain Python
objects (lists, dicts); SQL NULL stands for None (``none_as_null``), never the JSON ``null``.

These models are the *reference* for the schema, but the database is created and changed only
by the Alembic migrations in ``migrations/versions``. A test checks that the two agree, so a
change here without a migration (or the reverse) fails the test suite.

The service reads and writes through :class:`jupyter_gpusched.service.store.Store`, which uses
the ``Table`` objects (``Job.__table__`` ...) with SQLAlchemy Core for speed; the ORM classes are
there for readability and for ad-hoc queries.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from ..core.jobspec import FIELDS, NO_DEFAULT, SpecField

# Every constraint and index gets a predictable name: Alembic's batch mode on SQLite (which
# copies a table to alter it) and later migrations need names to refer to.
NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# Auto-increment ids: BIGINT on PostgreSQL (the audit log may outgrow 2**31 rows); on SQLite
# it must be exactly INTEGER to alias the rowid (a BIGINT primary key would not auto-increment).
BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")

# JSON columns: SQL NULL for None, so that ``IS NULL`` means what it says.
Json = sa.JSON(none_as_null=True)


class Base(DeclarativeBase):
    """Declarative base; its ``metadata`` is what Alembic compares against the database."""

    metadata = sa.MetaData(naming_convention=NAMING_CONVENTION)


_COLUMN_TYPES = {
    "integer": sa.Integer,
    "double": sa.Double,
    "boolean": sa.Boolean,
    "text": sa.Text,
    "json": lambda: Json,
}


def column_type(name: str) -> sa.types.TypeEngine:
    """The SQL type a spec's :class:`~..core.jobspec.Column` names (``string:N``: VARCHAR(N))."""
    if name.startswith("string:"):
        return sa.String(int(name.partition(":")[2]))
    return _COLUMN_TYPES[name]()


def spec_columns(fields: Iterable[SpecField] = FIELDS) -> list[sa.Column]:
    """The ``jobs`` columns of a job spec's stored fields (core/jobspec.py), in its order."""
    columns = []
    for spec_field in fields:
        column = spec_field.spec.column
        if column is None:
            continue
        default = {} if column.default is NO_DEFAULT else {"default": column.default}
        columns.append(
            sa.Column(
                spec_field.column_name,
                column_type(column.type),
                nullable=column.nullable,
                **default,
            )
        )
    return columns


def build_jobs_table(metadata: sa.MetaData, fields: Iterable[SpecField] = FIELDS) -> sa.Table:
    """The ``jobs`` table: the columns of the spec's stored fields, and a job's progress."""
    return sa.Table(
        "jobs",
        metadata,
        sa.Column("id", sa.String(64), primary_key=True),  # e.g. "j-000042"
        sa.Column("number", sa.Integer, unique=True, nullable=False),  # submit order
        *spec_columns(fields),  # the request, who submitted it, an admin's priority and hold
        # progress
        sa.Column("state", sa.String(16), nullable=False, default="pending"),
        sa.Column("reason", Json),  # {family, detail, message, eta}
        sa.Column("submit_time", sa.Double, nullable=False),
        sa.Column("start_time", sa.Double),  # of the current or last run
        sa.Column("first_start", sa.Double),
        sa.Column("end_time", sa.Double),
        sa.Column("runs", sa.Integer, nullable=False, default=0),
        sa.Column("preemptions", sa.Integer, nullable=False, default=0),
        sa.Column("deadline_missed", sa.Boolean),  # unfinished at its deadline (NULL: no)
        sa.Column("exit_code", sa.Integer),
        sa.Column("message", sa.Text),  # how it ended
        sa.Column("handle", Json),  # the launcher's, for this run
        sa.Index("ix_jobs_state", "state"),
        sa.Index("ix_jobs_user_number", "user", "number"),
    )


class Job(Base):
    """One job: its request (the columns of core/jobspec.py's JobSpec), and its current state."""

    __table__ = build_jobs_table(Base.metadata)


class Allocation(Base):
    """One run of a job on one node; ``end`` is NULL while it runs."""

    __tablename__ = "allocations"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(sa.String(64), sa.ForeignKey("jobs.id"))
    run: Mapped[int] = mapped_column(sa.Integer)  # 1 for the first run, 2 after a requeue ...
    node: Mapped[str] = mapped_column(sa.String(255))
    gpu_indices: Mapped[list[int]] = mapped_column(Json)
    gpu_model: Mapped[str] = mapped_column(sa.String(255))
    gpus: Mapped[float] = mapped_column(sa.Double)  # count x fraction: what is charged
    cpus: Mapped[float | None] = mapped_column(sa.Double)
    memory_gb: Mapped[float | None] = mapped_column(sa.Double)
    # copied from the job, so that usage queries need no join
    queue: Mapped[str] = mapped_column(sa.String(255))
    user: Mapped[str] = mapped_column(sa.String(255))
    tier: Mapped[int] = mapped_column(sa.Integer)
    start: Mapped[float] = mapped_column(sa.Double)
    end: Mapped[float | None] = mapped_column(sa.Double)

    __table_args__ = (
        sa.Index("ix_allocations_job_id_run", "job_id", "run"),
        sa.Index("ix_allocations_start", "start"),
        sa.Index("ix_allocations_end", "end"),
    )


class Setting(Base):
    """One setting: a JSON value under a key, with who changed it last and when."""

    __tablename__ = "settings"

    key: Mapped[str] = mapped_column(sa.String(255), primary_key=True)
    value: Mapped[Any] = mapped_column(Json, nullable=True)
    updated: Mapped[float] = mapped_column(sa.Double)
    updated_by: Mapped[str | None] = mapped_column(sa.String(255))


class Event(Base):
    """One audit-log entry. ``job_id`` is deliberately not a foreign key: the log outlives
    purged jobs, and records rejected submissions as they were."""

    __tablename__ = "events"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    time: Mapped[float] = mapped_column(sa.Double)
    kind: Mapped[str] = mapped_column(sa.String(64))  # submitted, started, preempted, ...
    job_id: Mapped[str | None] = mapped_column(sa.String(64))
    user: Mapped[str | None] = mapped_column(sa.String(255))  # whom it concerns
    actor: Mapped[str | None] = mapped_column(sa.String(255))  # who caused it
    node: Mapped[str | None] = mapped_column(sa.String(255))
    message: Mapped[str] = mapped_column(sa.Text, default="")
    data: Mapped[dict[str, Any] | None] = mapped_column(Json)

    __table_args__ = (
        sa.Index("ix_events_time", "time"),
        sa.Index("ix_events_job_id", "job_id"),
        sa.Index("ix_events_kind", "kind"),
    )


class HistoryRow(Base):
    """One moment of the cluster (the row of core/history.py's ``snapshot``, less its
    ``time``, in ``data``): what the web page draws over time."""

    __tablename__ = "history"

    id: Mapped[int] = mapped_column(sa.Integer, primary_key=True, autoincrement=True)
    time: Mapped[float] = mapped_column(sa.Double)
    data: Mapped[dict[str, Any]] = mapped_column(sa.JSON)  # never NULL

    __table_args__ = (sa.Index("ix_history_time", "time"),)


class UtilizationRun(Base):
    """A run of the service's GPU samples of one notebook server whose utilization stayed in one
    band (service/utilization_record.py): from the first sample's time to the last's, and the
    highest utilization among them (a sample's: its busiest GPU's)."""

    __tablename__ = "utilization_runs"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(sa.String(64))  # no foreign key: as events, for speed
    start: Mapped[float] = mapped_column(sa.Double)
    end: Mapped[float] = mapped_column(sa.Double)
    utilization: Mapped[float] = mapped_column(sa.Double)  # percent

    __table_args__ = (
        sa.Index("ix_utilization_runs_job_id", "job_id"),
        sa.Index("ix_utilization_runs_end", "end"),
    )


jobs_table: sa.Table = Job.__table__  # type: ignore[assignment]
allocations_table: sa.Table = Allocation.__table__  # type: ignore[assignment]
settings_table: sa.Table = Setting.__table__  # type: ignore[assignment]
events_table: sa.Table = Event.__table__  # type: ignore[assignment]
history_table: sa.Table = HistoryRow.__table__  # type: ignore[assignment]
utilization_table: sa.Table = UtilizationRun.__table__  # type: ignore[assignment]


class RowShape:
    """The columns of one table as the store checks a row dict against them: which keys it may
    have, which it must have, and what the others default to (from the models above)."""

    def __init__(self, table: sa.Table, what: str, skip: Iterable[str] = ()) -> None:
        self.what = what
        self.defaults: dict[str, Any] = {}
        self.required: list[str] = []
        for column in table.columns:
            if column.key in skip:
                continue
            default = column.default
            if default is None:
                self.defaults[column.key] = None
                if not column.nullable:
                    self.required.append(column.key)
            elif default.is_scalar:
                self.defaults[column.key] = default.arg
            else:  # a callable such as dict; SQLAlchemy wraps it to take a context argument
                self.defaults[column.key] = default.arg(None)  # type: ignore[operator]
        self.columns = frozenset(self.defaults)

    def check(self, fields: dict[str, Any]) -> None:
        """``ValueError`` naming any key of ``fields`` that is not a column."""
        unknown = fields.keys() - self.columns
        if unknown:
            raise ValueError(f"unknown {self.what} field(s): {', '.join(sorted(unknown))}")

    def row(self, row: dict[str, Any]) -> dict[str, Any]:
        """``row`` with every column present (defaults filled in), checked."""
        self.check(row)
        full = {**self.defaults, **row}
        missing = [key for key in self.required if full[key] is None]
        if missing:
            raise ValueError(f"{self.what} row lacks required field(s): {', '.join(missing)}")
        return full


JOB_ROW = RowShape(jobs_table, "job")
ALLOCATION_ROW = RowShape(allocations_table, "allocation", skip=("id",))  # id: auto-increment
EVENT_ROW = RowShape(events_table, "event", skip=("id",))
