"""A job's deadline: ``jobs.deadline``, when it must have finished (epoch seconds; NULL: none),
and ``jobs.deadline_missed`` (true once the engine said the job was unfinished at its deadline;
NULL or false: it was not, or it has none), stored so that a restart does not report a miss
again.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-05
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("deadline", sa.Double(), nullable=True))
        batch.add_column(sa.Column("deadline_missed", sa.Boolean(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("deadline_missed")
        batch.drop_column("deadline")
