"""Cancelled scheduled messages in the metadata database (``schedule_cancels``;
docs/scheduling.md).

The API records a producer's cancel; the delivery worker that holds a scheduled message asks,
when its time comes and before its first call, whether it was cancelled. Kept in the database,
not Redis, because a cancel must outlive Redis forgetting its data as group state does. A row
is kept until the latest time its message could still be due, and dropped after. Same contract
as :mod:`state.metadata`: synchronous, one short transaction per method, safe from many threads.
"""

from __future__ import annotations

from collections.abc import Collection

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from state.schema import schedule_cancels
from state.sql import transaction


class ScheduleCancels:
    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def cancel(
        self, project: str, topic: str, message_id: str, at_ms: int, expires_at_ms: int
    ) -> int:
        """Records a cancel of ``message_id`` (the first one stands); answers when it was first
        cancelled. Rows past their expiry are dropped on the way."""
        table = schedule_cancels
        row = {
            "project": project,
            "topic": topic,
            "message_id": message_id,
            "cancelled_at_ms": at_ms,
            "expires_at_ms": expires_at_ms,
        }
        # Imported here: only the API writes cancels, and a worker need not load the dialects.
        from sqlalchemy.dialects import postgresql, sqlite

        with transaction(self._engine, write=True) as conn:
            conn.execute(sa.delete(table).where(table.c.expires_at_ms < at_ms))
            insert = (
                postgresql.insert(table)
                if conn.dialect.name == "postgresql"
                else sqlite.insert(table)
            )
            conn.execute(insert.values(row).on_conflict_do_nothing())
            return int(
                conn.execute(
                    sa.select(table.c.cancelled_at_ms).where(
                        table.c.project == project,
                        table.c.topic == topic,
                        table.c.message_id == message_id,
                    )
                ).scalar_one()
            )

    def cancelled(self, project: str, topic: str, message_ids: Collection[str]) -> set[str]:
        """Which of ``message_ids`` of ``topic`` a producer cancelled."""
        table = schedule_cancels
        ids = sorted(set(message_ids))
        found: set[str] = set()
        with transaction(self._engine) as conn:
            for start in range(0, len(ids), 500):
                found.update(
                    conn.execute(
                        sa.select(table.c.message_id).where(
                            table.c.project == project,
                            table.c.topic == topic,
                            table.c.message_id.in_(ids[start : start + 500]),
                        )
                    ).scalars()
                )
        return found
