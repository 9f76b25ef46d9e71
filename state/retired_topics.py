"""The ingest topics of deleted topics (docs/ingest.md, "A topic created again").

Deleting a topic empties its ingest topic but keeps it in Kafka: the ingest job's checkpoint
remembers how far it read each ingest partition, and a topic created again under the same name
with a new Kafka topic would start below that, so the job would skip its first messages. Kept,
its offsets only grow. While the topic is deleted its ingest topic is *retired*: listed in one
Redis set, which the API writes (before it empties the topic, and until it creates the topic
again) and the ingest job reads at every batch, skipping the retired topics' records and
leaving their main topics alone.
"""

from __future__ import annotations

import logging
from typing import Protocol

import redis
import redis.asyncio

from setu.errors import DependencyUnavailable
from state import keys

log = logging.getLogger(__name__)


class RetiredList(Protocol):
    """The API's side of the list. Contract (:class:`RedisRetiredList` and
    :class:`StubRetiredList`, the same tests on both): a retired topic is listed until it is
    reopened; retiring or reopening twice is the same as once."""

    async def retire(self, ingest_topic: str) -> None:
        """Marks ``ingest_topic`` retired (its topic is being deleted)."""

    async def is_retired(self, ingest_topic: str) -> bool: ...

    async def reopen(self, ingest_topic: str) -> None:
        """Takes ``ingest_topic`` off the list (its topic is being created again)."""


class RedisRetiredList:
    """One Redis set; a Redis error is :class:`DependencyUnavailable` (a 503)."""

    def __init__(self, client: redis.asyncio.Redis[bytes]) -> None:
        self._client = client

    async def retire(self, ingest_topic: str) -> None:
        try:
            await self._client.sadd(keys.retired_ingest_topics(), ingest_topic)
        except redis.RedisError as exc:
            raise DependencyUnavailable(f"Redis: {exc}") from exc

    async def is_retired(self, ingest_topic: str) -> bool:
        try:
            return bool(await self._client.sismember(keys.retired_ingest_topics(), ingest_topic))
        except redis.RedisError as exc:
            raise DependencyUnavailable(f"Redis: {exc}") from exc

    async def reopen(self, ingest_topic: str) -> None:
        try:
            await self._client.srem(keys.retired_ingest_topics(), ingest_topic)
        except redis.RedisError as exc:
            raise DependencyUnavailable(f"Redis: {exc}") from exc


class StubRetiredList:
    """In memory."""

    def __init__(self) -> None:
        self.topics: set[str] = set()

    async def retire(self, ingest_topic: str) -> None:
        self.topics.add(ingest_topic)

    async def is_retired(self, ingest_topic: str) -> bool:
        return ingest_topic in self.topics

    async def reopen(self, ingest_topic: str) -> None:
        self.topics.discard(ingest_topic)


class RetiredTopics:
    """The ingest job's view of the retired list: read afresh at every call; when Redis does
    not answer, the last list read (the API cannot change it while Redis is away either)."""

    def __init__(self, client: redis.Redis[bytes]) -> None:
        self._client = client
        self._last: frozenset[str] = frozenset()

    def __call__(self) -> frozenset[str]:
        try:
            members = self._client.smembers(keys.retired_ingest_topics())
        except redis.RedisError as exc:
            log.warning("could not read the retired ingest topics (%s); using the last list", exc)
            return self._last
        self._last = frozenset(m.decode() for m in members)
        return self._last
