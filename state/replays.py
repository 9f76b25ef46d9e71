"""Replays in the metadata database (``replays``, ``replay_partitions``; docs/replays.md).

The API writes a replay and ends it (cancel); the delivery worker that owns a partition of
the subscription writes that partition's progress, and marks the replay done when its last
partition is. Same contract as :mod:`state.metadata`: synchronous, one short transaction per
method, safe from many threads.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine, Row
from sqlalchemy.exc import IntegrityError

from setu.clock import now_ms
from setu.errors import Conflict, NotFound
from setu.replay import PartitionProgress, Replay, ReplayState, spec_from_json
from state.schema import replay_partitions, replays
from state.sql import transaction

Progress = dict[int, PartitionProgress]


def _replay(row: Row[Any]) -> Replay:
    return Replay(
        id=row.id,
        project=row.project,
        subscription=row.subscription,
        partitions=row.partitions,
        created_at_ms=row.created_at_ms,
        state=ReplayState(row.state),
        ended_at_ms=row.ended_at_ms,
        **spec_from_json(row.spec),
    )


class ReplayStore:
    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def create(self, replay: Replay, max_running: int) -> Replay:
        """Stores a new replay; Conflict when the subscription already has ``max_running``
        replays running."""
        with transaction(self._engine, write=True) as conn:
            running = conn.execute(
                sa.select(sa.func.count())
                .select_from(replays)
                .where(
                    replays.c.project == replay.project,
                    replays.c.subscription == replay.subscription,
                    replays.c.state == ReplayState.RUNNING.value,
                )
            ).scalar_one()
            if running >= max_running:
                raise Conflict(
                    f"subscription {replay.subscription!r} has {running} replays running "
                    f"(at most {max_running}); wait for one to end or cancel one"
                )
            conn.execute(
                sa.insert(replays).values(
                    id=replay.id,
                    project=replay.project,
                    subscription=replay.subscription,
                    spec=replay.spec_json(),
                    partitions=replay.partitions,
                    state=replay.state.value,
                    created_at_ms=replay.created_at_ms,
                    ended_at_ms=replay.ended_at_ms,
                )
            )
        return replay

    def get(self, project: str, subscription: str, replay_id: str) -> tuple[Replay, Progress]:
        with transaction(self._engine) as conn:
            replay = self._row(conn, project, subscription, replay_id)
            return replay, self._progress(conn, replay_id)

    def listed(self, project: str, subscription: str, limit: int) -> list[tuple[Replay, Progress]]:
        """The subscription's replays, newest first."""
        with transaction(self._engine) as conn:
            rows = conn.execute(
                sa.select(replays)
                .where(replays.c.project == project, replays.c.subscription == subscription)
                .order_by(replays.c.created_at_ms.desc(), replays.c.id)
                .limit(limit)
            ).all()
            return [(_replay(row), self._progress(conn, row.id)) for row in rows]

    def cancel(self, project: str, subscription: str, replay_id: str) -> Replay:
        """Ends a running replay; a cancelled one stays as it is; Conflict when it is done."""
        with transaction(self._engine, write=True) as conn:
            replay = self._row(conn, project, subscription, replay_id)
            if replay.state is ReplayState.DONE:
                raise Conflict(f"replay {replay_id!r} is done; there is nothing to cancel")
            if replay.state is ReplayState.RUNNING:
                conn.execute(
                    sa.update(replays)
                    .where(replays.c.id == replay_id)
                    .values(state=ReplayState.CANCELLED.value, ended_at_ms=now_ms())
                )
            return self._row(conn, project, subscription, replay_id)

    def running(self) -> list[Replay]:
        """Every running replay (what delivery workers carry out)."""
        with transaction(self._engine) as conn:
            rows = conn.execute(
                sa.select(replays)
                .where(replays.c.state == ReplayState.RUNNING.value)
                .order_by(replays.c.created_at_ms, replays.c.id)
            ).all()
        return [_replay(row) for row in rows]

    def progress(self, replay_id: str) -> Progress:
        with transaction(self._engine) as conn:
            return self._progress(conn, replay_id)

    def save(self, replay_id: str, partition: int, progress: PartitionProgress) -> bool:
        """Stores one partition's progress; False when the replay is gone (its subscription
        was deleted) or no longer running, so its owner stops."""
        doc = progress.json()
        with transaction(self._engine, write=True) as conn:
            state = conn.execute(
                sa.select(replays.c.state).where(replays.c.id == replay_id)
            ).scalar_one_or_none()
            if state != ReplayState.RUNNING.value:
                return False
            where = (replay_partitions.c.replay_id == replay_id) & (
                replay_partitions.c.partition == partition
            )
            values = {"progress": doc, "updated_at_ms": now_ms()}
            if conn.execute(sa.update(replay_partitions).where(where).values(values)).rowcount:
                return True
            try:
                with conn.begin_nested():
                    conn.execute(
                        sa.insert(replay_partitions).values(
                            replay_id=replay_id, partition=partition, **values
                        )
                    )
            except IntegrityError:  # written meanwhile by another owner: ours is newer
                conn.execute(sa.update(replay_partitions).where(where).values(values))
            return True

    def finish_if_complete(self, replay_id: str) -> bool:
        """Marks the replay done when every partition's progress says so; True if it is."""
        with transaction(self._engine, write=True) as conn:
            row = conn.execute(sa.select(replays).where(replays.c.id == replay_id)).first()
            if row is None or row.state != ReplayState.RUNNING.value:
                return row is not None and row.state == ReplayState.DONE.value
            parts = self._progress(conn, replay_id)
            if len(parts) < row.partitions or not all(p.done for p in parts.values()):
                return False
            conn.execute(
                sa.update(replays)
                .where(replays.c.id == replay_id)
                .values(state=ReplayState.DONE.value, ended_at_ms=now_ms())
            )
            return True

    @staticmethod
    def _row(conn: Connection, project: str, subscription: str, replay_id: str) -> Replay:
        row = conn.execute(
            sa.select(replays).where(
                replays.c.id == replay_id,
                replays.c.project == project,
                replays.c.subscription == subscription,
            )
        ).first()
        if row is None:
            raise NotFound(f"replay {replay_id!r} not found")
        return _replay(row)

    @staticmethod
    def _progress(conn: Connection, replay_id: str) -> Progress:
        rows = conn.execute(
            sa.select(replay_partitions.c.partition, replay_partitions.c.progress).where(
                replay_partitions.c.replay_id == replay_id
            )
        ).all()
        return {row.partition: PartitionProgress.from_json(row.progress) for row in rows}
