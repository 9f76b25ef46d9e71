"""Replays (docs/replays.md): what was asked, and each partition's progress.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "replays",
        sa.Column("id", sa.String(40), nullable=False),
        sa.Column("project", sa.String(63), nullable=False),
        sa.Column("subscription", sa.String(63), nullable=False),
        sa.Column("spec", sa.JSON, nullable=False),
        sa.Column("partitions", sa.Integer, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("created_at_ms", sa.BigInteger, nullable=False),
        sa.Column("ended_at_ms", sa.BigInteger, nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_replays"),
        sa.ForeignKeyConstraint(
            ["project", "subscription"],
            ["subscriptions.project", "subscriptions.name"],
            ondelete="CASCADE",
            name="fk_replays_subscription_subscriptions",
        ),
    )
    op.create_index("ix_replays_subscription", "replays", ["project", "subscription"])
    op.create_index("ix_replays_state", "replays", ["state"])
    op.create_table(
        "replay_partitions",
        sa.Column("replay_id", sa.String(40), nullable=False),
        sa.Column("partition", sa.Integer, nullable=False),
        sa.Column("progress", sa.JSON, nullable=False),
        sa.Column("updated_at_ms", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("replay_id", "partition", name="pk_replay_partitions"),
        sa.ForeignKeyConstraint(
            ["replay_id"],
            ["replays.id"],
            ondelete="CASCADE",
            name="fk_replay_partitions_replay_id_replays",
        ),
    )


def downgrade() -> None:
    op.drop_table("replay_partitions")
    op.drop_index("ix_replays_state", table_name="replays")
    op.drop_index("ix_replays_subscription", table_name="replays")
    op.drop_table("replays")
