"""Initial schema: jobs, allocations, settings, events.

Revision ID: 0001
Revises:
Create Date: 2025-01-01

Tables are spelled out here rather than created from ``models.py``: a migration must keep
creating the schema *as it was* at this revision, whatever the models say later.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Same types as models.py (frozen copies, see above).
BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
Json = sa.JSON(none_as_null=True)


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("user", sa.String(255), nullable=False),
        sa.Column("queue", sa.String(255), nullable=False),
        sa.Column("tier", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("name", sa.Text(), nullable=True),
        sa.Column("gpus", sa.Integer(), nullable=False),
        sa.Column("gpus_per_node", sa.Integer(), nullable=True),
        sa.Column("gpu_models", Json, nullable=True),
        sa.Column("gpu_fraction", sa.Double(), nullable=False),
        sa.Column("cpus", sa.Double(), nullable=True),
        sa.Column("memory_gb", sa.Double(), nullable=True),
        sa.Column("walltime", sa.Double(), nullable=True),
        sa.Column("labels", Json, nullable=False),
        sa.Column("command", sa.Text(), nullable=True),
        sa.Column("notebook", sa.Text(), nullable=True),
        sa.Column("env", Json, nullable=False),
        sa.Column("cwd", sa.Text(), nullable=True),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("held", sa.Boolean(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("reason", Json, nullable=True),
        sa.Column("submit_time", sa.Double(), nullable=False),
        sa.Column("start_time", sa.Double(), nullable=True),
        sa.Column("first_start", sa.Double(), nullable=True),
        sa.Column("end_time", sa.Double(), nullable=True),
        sa.Column("runs", sa.Integer(), nullable=False),
        sa.Column("preemptions", sa.Integer(), nullable=False),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("message", sa.Text(), nullable=True),
        sa.Column("handle", Json, nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_jobs"),
        sa.UniqueConstraint("number", name="uq_jobs_number"),
    )
    op.create_index("ix_jobs_state", "jobs", ["state"])
    op.create_index("ix_jobs_user_number", "jobs", ["user", "number"])

    op.create_table(
        "allocations",
        sa.Column("id", BigId, autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(64), nullable=False),
        sa.Column("run", sa.Integer(), nullable=False),
        sa.Column("node", sa.String(255), nullable=False),
        sa.Column("gpu_indices", Json, nullable=False),
        sa.Column("gpu_model", sa.String(255), nullable=False),
        sa.Column("gpus", sa.Double(), nullable=False),
        sa.Column("cpus", sa.Double(), nullable=True),
        sa.Column("memory_gb", sa.Double(), nullable=True),
        sa.Column("queue", sa.String(255), nullable=False),
        sa.Column("user", sa.String(255), nullable=False),
        sa.Column("tier", sa.Integer(), nullable=False),
        sa.Column("start", sa.Double(), nullable=False),
        sa.Column("end", sa.Double(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_allocations"),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name="fk_allocations_job_id_jobs"),
    )
    op.create_index("ix_allocations_job_id_run", "allocations", ["job_id", "run"])
    op.create_index("ix_allocations_start", "allocations", ["start"])
    op.create_index("ix_allocations_end", "allocations", ["end"])

    op.create_table(
        "settings",
        sa.Column("key", sa.String(255), nullable=False),
        sa.Column("value", Json, nullable=True),
        sa.Column("updated", sa.Double(), nullable=False),
        sa.Column("updated_by", sa.String(255), nullable=True),
        sa.PrimaryKeyConstraint("key", name="pk_settings"),
    )

    op.create_table(
        "events",
        sa.Column("id", BigId, autoincrement=True, nullable=False),
        sa.Column("time", sa.Double(), nullable=False),
        sa.Column("kind", sa.String(64), nullable=False),
        sa.Column("job_id", sa.String(64), nullable=True),
        sa.Column("user", sa.String(255), nullable=True),
        sa.Column("actor", sa.String(255), nullable=True),
        sa.Column("node", sa.String(255), nullable=True),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("data", Json, nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_events"),
    )
    op.create_index("ix_events_time", "events", ["time"])
    op.create_index("ix_events_job_id", "events", ["job_id"])
    op.create_index("ix_events_kind", "events", ["kind"])


def downgrade() -> None:
    op.drop_table("events")
    op.drop_table("settings")
    op.drop_table("allocations")
    op.drop_table("jobs")
