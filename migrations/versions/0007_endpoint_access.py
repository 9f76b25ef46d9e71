"""How a subscription's calls reach a protected endpoint (docs/security.md §4): its TLS and
OAuth2 settings as one sealed JSON object, and the egress proxy it names.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-29
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
    # Existing subscriptions have neither: NULL.
    with op.batch_alter_table("subscriptions") as batch:
        batch.add_column(sa.Column("endpoint_access", sa.Text, nullable=True))
        batch.add_column(sa.Column("endpoint_proxy", sa.String(64), nullable=True))


def downgrade() -> None:
    # Plain DROP COLUMN (SQLite 3.35+ and PostgreSQL), as 0006 does.
    op.execute("ALTER TABLE subscriptions DROP COLUMN endpoint_proxy")
    op.execute("ALTER TABLE subscriptions DROP COLUMN endpoint_access")
