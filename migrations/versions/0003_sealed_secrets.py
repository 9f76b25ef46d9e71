"""Secrets sealed at rest, and up to two signing secrets per subscription (docs/security.md §5).

``subscriptions.signing_secret`` (plain text) becomes ``signing_secrets`` (one sealed JSON
list), and every endpoint header value is sealed. Rows that hold a secret need the key:
``setu migrate`` passes a sealer made from ``SETU_SECRET_KEY``, and this revision refuses to
run without one when there is anything to seal. Downgrading opens them again.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-24
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import context, op

from state.sealing import Sealer

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The id the one secret of an older subscription gets.
FIRST_SECRET_ID = "ss_first"

_subs = sa.table(
    "subscriptions",
    sa.column("project", sa.String),
    sa.column("name", sa.String),
    sa.column("endpoint_headers", sa.JSON),
    sa.column("signing_secret", sa.Text),
    sa.column("signing_secrets", sa.Text),
    sa.column("created_at_ms", sa.BigInteger),
)


def _sealer(rows: int) -> Sealer:
    sealer = context.config.attributes.get("sealer")
    if not isinstance(sealer, Sealer):
        raise RuntimeError(
            f"{rows} subscription(s) hold secrets to seal: set SETU_SECRET_KEY "
            "(make one with `setu secrets new-key`) and run `setu migrate` again"
        )
    return sealer


def _with_secrets(conn: sa.Connection) -> list[Any]:
    return [
        row
        for row in conn.execute(sa.select(_subs)).all()
        if row.endpoint_headers or row.signing_secret is not None
    ]


def upgrade() -> None:
    with op.batch_alter_table("subscriptions") as batch:
        batch.add_column(sa.Column("signing_secrets", sa.Text, nullable=True))
    conn = op.get_bind()
    rows = _with_secrets(conn)
    if rows:
        sealer = _sealer(len(rows))
        for row in rows:
            held = (
                None
                if row.signing_secret is None
                else sealer.seal(
                    json.dumps(
                        [
                            {
                                "id": FIRST_SECRET_ID,
                                "value": row.signing_secret,
                                "created_at_ms": row.created_at_ms,
                                "expires_at_ms": None,
                            }
                        ]
                    )
                )
            )
            conn.execute(
                sa.update(_subs)
                .where(_subs.c.project == row.project, _subs.c.name == row.name)
                .values(
                    endpoint_headers=[[k, sealer.seal(v)] for k, v in row.endpoint_headers],
                    signing_secrets=held,
                )
            )
    with op.batch_alter_table("subscriptions") as batch:
        batch.drop_column("signing_secret")


def downgrade() -> None:
    with op.batch_alter_table("subscriptions") as batch:
        batch.add_column(sa.Column("signing_secret", sa.Text, nullable=True))
    conn = op.get_bind()
    rows = [
        row
        for row in conn.execute(sa.select(_subs)).all()
        if row.endpoint_headers or row.signing_secrets is not None
    ]
    if rows:
        sealer = _sealer(len(rows))
        for row in rows:
            held = json.loads(sealer.open(row.signing_secrets)) if row.signing_secrets else []
            conn.execute(
                sa.update(_subs)
                .where(_subs.c.project == row.project, _subs.c.name == row.name)
                .values(
                    endpoint_headers=[[k, sealer.open(v)] for k, v in row.endpoint_headers],
                    # The older schema holds one secret: the current one.
                    signing_secret=held[0]["value"] if held else None,
                )
            )
    with op.batch_alter_table("subscriptions") as batch:
        batch.drop_column("signing_secrets")
