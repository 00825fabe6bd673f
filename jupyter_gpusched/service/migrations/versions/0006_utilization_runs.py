"""Notebook servers' GPU utilization over time: ``utilization_runs``, runs of the service's own
samples within one band (core/utilization_bands.py), for ``export-trace`` and the idle-timeout
what-if.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-05
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "utilization_runs",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("job_id", sa.String(64), nullable=False),
        sa.Column("start", sa.Double(), nullable=False),
        sa.Column("end", sa.Double(), nullable=False),
        sa.Column("utilization", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_utilization_runs"),
    )
    op.create_index("ix_utilization_runs_job_id", "utilization_runs", ["job_id"])
    op.create_index("ix_utilization_runs_end", "utilization_runs", ["end"])


def downgrade() -> None:
    op.drop_index("ix_utilization_runs_end", table_name="utilization_runs")
    op.drop_index("ix_utilization_runs_job_id", table_name="utilization_runs")
    op.drop_table("utilization_runs")
