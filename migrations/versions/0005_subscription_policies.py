"""Subscription policies, why a policy paused a subscription, how the latest stop was asked
for, and where a project's operational events go (docs/policies.md).

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-24
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
    # NULL policies: every policy at its default, which is how earlier subscriptions behave
    # from here on (a breaker with default thresholds, auto-pause after a day).
    with op.batch_alter_table("subscriptions") as batch:
        batch.add_column(sa.Column("policies", sa.JSON, nullable=True))
        batch.add_column(sa.Column("paused_reason", sa.Text, nullable=True))
        batch.add_column(sa.Column("stop_mode", sa.String(8), nullable=True))
        batch.add_column(sa.Column("stop_requested_at_ms", sa.BigInteger, nullable=True))
    op.create_table(
        "notifications",
        sa.Column("project", sa.String(63), primary_key=True),
        sa.Column("url", sa.Text, nullable=False),
        sa.Column("events", sa.JSON, nullable=False),
        sa.Column("signing_secret", sa.Text, nullable=True),
        sa.Column("updated_at_ms", sa.BigInteger, nullable=False),
        sa.ForeignKeyConstraint(
            ["project"],
            ["projects.name"],
            ondelete="CASCADE",
            name="fk_notifications_project_projects",
        ),
    )


def downgrade() -> None:
    op.drop_table("notifications")
    for column in ("stop_requested_at_ms", "stop_mode", "paused_reason", "policies"):
        op.execute(f"ALTER TABLE subscriptions DROP COLUMN {column}")
