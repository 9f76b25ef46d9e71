"""The API's way into Redis: one object, made by the composition root (``api/app.py``) on the
process's one client, that hands out each adapter a route needs. Routes never hold the client
itself, so every Redis command the API sends is written in ``state/``."""

from __future__ import annotations

from redis.asyncio import Redis

from state.attempt_log import RedisAttemptLog
from state.groups import RedisGroupStore, announce_subscriptions
from state.ingest_status import read_status_async
from state.producer_marks import marks_loaded, read_last_sequence
from state.redis_clients import close
from state.retired_topics import RedisRetiredList
from state.stream_sessions import StreamSessions
from state.workers import RedisWorkers


class RedisState:
    def __init__(self, client: Redis[bytes]) -> None:
        self._client = client

    def groups(self, project: str, subscription: str) -> RedisGroupStore:
        return RedisGroupStore(self._client, project, subscription)

    def workers(self) -> RedisWorkers:
        return RedisWorkers(self._client)

    def attempt_log(self, project: str, subscription: str, hours: int) -> RedisAttemptLog:
        return RedisAttemptLog(self._client, project, subscription, hours)

    def retired_topics(self) -> RedisRetiredList:
        return RedisRetiredList(self._client)

    def stream_sessions(self, lease_ms: int) -> StreamSessions:
        return StreamSessions(self._client, lease_ms)

    async def last_sequence(
        self, project: str, topic: str, producer: str, topic_incarnation: int
    ) -> int:
        """:func:`state.producer_marks.read_last_sequence`."""
        return await read_last_sequence(self._client, project, topic, producer, topic_incarnation)

    async def marks_loaded(self) -> bool:
        return await marks_loaded(self._client)

    async def ingest_status(self) -> dict[str, str]:
        return await read_status_async(self._client)

    async def announce_subscriptions(self) -> None:
        """Tells the workers that a subscription's record changed
        (``keys.subscriptions_changed``)."""
        await announce_subscriptions(self._client)

    async def answers(self) -> None:
        """Raises unless Redis answers a PING (the health report)."""
        await self._client.ping()

    async def close(self) -> None:
        await close(self._client)
