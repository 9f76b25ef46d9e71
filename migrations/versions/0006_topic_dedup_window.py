"""Each topic's window for de-duplication by message id (docs/ingest.md).

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-26
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
    # Topics that exist take the default window, as a topic created without one does.
    with op.batch_alter_table("topics") as batch:
        batch.add_column(
            sa.Column("dedup_window_seconds", sa.Integer, nullable=False, server_default="300")
        )


def downgrade() -> None:
    # Plain DROP COLUMN (SQLite 3.35+ and PostgreSQL): a batch copy of ``topics`` would drop a
    # table that subscriptions refer to.
    op.execute("ALTER TABLE topics DROP COLUMN dedup_window_seconds")
