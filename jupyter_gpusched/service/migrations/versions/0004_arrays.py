"""Jobs of a job array (POST api/jobs with "array"): ``jobs.array_id``, ``jobs.array_index``
and ``jobs.array_max_running`` (core/arrays.py). NULL for every job before arrays, and for
plain jobs since.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("array_id", sa.String(64), nullable=True))
        batch.add_column(sa.Column("array_index", sa.Integer, nullable=True))
        batch.add_column(sa.Column("array_max_running", sa.Integer, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("array_max_running")
        batch.drop_column("array_index")
        batch.drop_column("array_id")
