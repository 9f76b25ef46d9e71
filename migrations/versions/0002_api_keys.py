"""API keys (docs/security.md).

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-24
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "api_keys",
        sa.Column("key_id", sa.String(16), nullable=False),
        sa.Column("name", sa.String(100), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("project", sa.String(63), nullable=True),
        sa.Column("topics", sa.JSON, nullable=True),
        sa.Column("digest", sa.String(64), nullable=False),
        sa.Column("created_at_ms", sa.BigInteger, nullable=False),
        sa.Column("expires_at_ms", sa.BigInteger, nullable=True),
        sa.Column("last_used_at_ms", sa.BigInteger, nullable=True),
        sa.Column("revoked_at_ms", sa.BigInteger, nullable=True),
        sa.PrimaryKeyConstraint("key_id", name="pk_api_keys"),
    )
    op.create_index("ix_api_keys_project", "api_keys", ["project"])


def downgrade() -> None:
    op.drop_index("ix_api_keys_project", table_name="api_keys")
    op.drop_table("api_keys")
