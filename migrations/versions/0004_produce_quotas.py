"""Per-project produce quotas (docs/security.md §6).

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-24
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
    with op.batch_alter_table("projects") as batch:
        batch.add_column(sa.Column("quota_messages_per_second", sa.Float, nullable=True))
        batch.add_column(sa.Column("quota_bytes_per_second", sa.Float, nullable=True))


def downgrade() -> None:
    # Plain DROP COLUMN (SQLite 3.35+ and PostgreSQL): a batch copy of ``projects`` would drop
    # a table that topics and keys refer to, which SQLite's foreign keys refuse.
    for column in ("quota_bytes_per_second", "quota_messages_per_second"):
        op.execute(f"ALTER TABLE projects DROP COLUMN {column}")
