"""Scheduled messages their producers cancelled (docs/scheduling.md).

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "schedule_cancels",
        sa.Column("project", sa.String(63), nullable=False),
        sa.Column("topic", sa.String(63), nullable=False),
        sa.Column("message_id", sa.String(100), nullable=False),
        sa.Column("cancelled_at_ms", sa.BigInteger, nullable=False),
        sa.Column("expires_at_ms", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("project", "topic", "message_id", name="pk_schedule_cancels"),
        sa.ForeignKeyConstraint(
            ["project", "topic"],
            ["topics.project", "topics.name"],
            ondelete="CASCADE",
            name="fk_schedule_cancels_topic_topics",
        ),
    )
    op.create_index("ix_schedule_cancels_expires", "schedule_cancels", ["expires_at_ms"])


def downgrade() -> None:
    op.drop_index("ix_schedule_cancels_expires", table_name="schedule_cancels")
    op.drop_table("schedule_cancels")
