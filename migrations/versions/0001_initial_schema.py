"""Projects, topics and subscriptions.

Revision ID: 0001
Revises:
Create Date: 2025-01-01

Self-contained on purpose: migrations describe the schema as it was, so they never import the
current tables from ``state.schema``.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

NAME = sa.String(63)


def upgrade() -> None:
    op.create_table(
        "projects",
        sa.Column("name", NAME, nullable=False),
        sa.Column("description", sa.Text, nullable=False),
        sa.Column("created_at_ms", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_projects"),
    )
    op.create_table(
        "topics",
        sa.Column("project", NAME, nullable=False),
        sa.Column("name", NAME, nullable=False),
        sa.Column("grouped", sa.Boolean, nullable=False),
        sa.Column("partitions", sa.Integer, nullable=False),
        sa.Column("retention_hours", sa.Integer, nullable=False),
        sa.Column("deleting", sa.Boolean, nullable=False),
        sa.Column("created_at_ms", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("project", "name", name="pk_topics"),
        sa.ForeignKeyConstraint(
            ["project"],
            ["projects.name"],
            ondelete="RESTRICT",
            name="fk_topics_project_projects",
        ),
    )
    op.create_table(
        "subscriptions",
        sa.Column("project", NAME, nullable=False),
        sa.Column("name", NAME, nullable=False),
        sa.Column("topic", NAME, nullable=False),
        sa.Column("grouped", sa.Boolean, nullable=False),
        sa.Column("endpoint_url", sa.Text, nullable=False),
        sa.Column("endpoint_method", sa.String(8), nullable=False),
        sa.Column("endpoint_headers", sa.JSON, nullable=False),
        sa.Column("endpoint_timeout_ms", sa.Integer, nullable=False),
        sa.Column("retry_delays_ms", sa.JSON, nullable=False),
        sa.Column("retryable_codes", sa.JSON, nullable=True),
        sa.Column("dead_letter_policy", sa.String(8), nullable=False),
        sa.Column("max_in_flight", sa.Integer, nullable=False),
        sa.Column("rate_limit_per_second", sa.Float, nullable=True),
        sa.Column("signing_secret", sa.Text, nullable=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("deleting", sa.Boolean, nullable=False),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("seek_to_ms", sa.BigInteger, nullable=True),
        sa.Column("seek_generation", sa.Integer, nullable=False),
        sa.Column("created_at_ms", sa.BigInteger, nullable=False),
        sa.Column("updated_at_ms", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("project", "name", name="pk_subscriptions"),
        sa.ForeignKeyConstraint(
            ["project", "topic"],
            ["topics.project", "topics.name"],
            ondelete="RESTRICT",
            name="fk_subscriptions_topic_topics",
        ),
    )
    op.create_index("ix_subscriptions_topic", "subscriptions", ["project", "topic"])


def downgrade() -> None:
    op.drop_index("ix_subscriptions_topic", table_name="subscriptions")
    op.drop_table("subscriptions")
    op.drop_table("topics")
    op.drop_table("projects")
