"""The cluster over time: ``history``, one row every ``history_interval`` seconds (GPUs by tier
and queue, pending GPUs by reason family, measured utilization), for the web page's charts.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "history",
        # an INTEGER id (SQLite's rowid): one row a minute is 2**31 rows in 4,000 years
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("time", sa.Double(), nullable=False),
        sa.Column("data", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_history"),
    )
    op.create_index("ix_history_time", "history", ["time"])


def downgrade() -> None:
    op.drop_index("ix_history_time", table_name="history")
    op.drop_table("history")
