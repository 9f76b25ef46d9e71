"""Topic metadata for the produce path, cached in memory so produce does not query the database
per message.

A known topic is trusted for ``ttl_s`` (default 5 s), an unknown one for ``negative_ttl_s``
(default 1 s), so a burst against a missing topic costs one query per second. This process
invalidates an entry whenever it creates or deletes the topic; another API replica sees the
change within the TTL (a produce to a just-deleted topic then fails at Kafka with 503).
Concurrent misses on one key share a single load.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial

from setu import names
from setu.errors import NotFound
from setu.model import Topic

Loader = Callable[[str, str], Awaitable[Topic | None]]


@dataclass(frozen=True, slots=True)
class CachedTopic:
    topic: Topic
    ingest_topic: str


class TopicCache:
    def __init__(
        self,
        load: Loader,
        *,
        ttl_s: float = 5.0,
        negative_ttl_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._load = load
        self._ttl_s = ttl_s
        self._negative_ttl_s = negative_ttl_s
        self._clock = clock
        self._entries: dict[tuple[str, str], tuple[float, CachedTopic | None]] = {}
        self._loading: dict[tuple[str, str], asyncio.Task[CachedTopic | None]] = {}

    async def get(self, project: str, topic: str) -> CachedTopic:
        """The topic, from memory when fresh; raises NotFound when it does not exist."""
        key = (project, topic)
        entry = self._entries.get(key)
        if entry is not None and entry[0] > self._clock():
            found = entry[1]
        else:
            found = await self._refresh(key)
        if found is None:
            raise NotFound(f"topic {topic!r} not found in project {project!r}")
        return found

    def invalidate(self, project: str, topic: str) -> None:
        self._entries.pop((project, topic), None)

    async def _refresh(self, key: tuple[str, str]) -> CachedTopic | None:
        task = self._loading.get(key)
        if task is None:
            # A task of its own, so a caller that goes away does not cancel the others' load.
            task = asyncio.create_task(self._fetch(key))
            self._loading[key] = task
            task.add_done_callback(partial(self._finished, key))
        return await asyncio.shield(task)

    async def _fetch(self, key: tuple[str, str]) -> CachedTopic | None:
        topic = await self._load(*key)
        found = None if topic is None else CachedTopic(topic, names.ingest_topic(*key))
        ttl = self._ttl_s if found is not None else self._negative_ttl_s
        self._entries[key] = (self._clock() + ttl, found)
        return found

    def _finished(self, key: tuple[str, str], task: asyncio.Task[CachedTopic | None]) -> None:
        self._loading.pop(key, None)
        if not task.cancelled():
            task.exception()  # retrieved: every waiter already got it
