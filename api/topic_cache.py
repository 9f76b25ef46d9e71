"""Topic metadata for the produce path, cached in memory so produce does not query the database
per message.

A known topic is trusted for ``ttl_s`` (default 5 s), an unknown one for ``negative_ttl_s``
(default 1 s), so a burst against a missing topic costs one query per second. This process
invalidates an entry whenever it creates or deletes the topic; another API replica sees the
change within the TTL (a produce to a just-deleted topic then fails at Kafka with 503).
Concurrent misses on one key share a single load, and at most ``max_entries`` topics (known
or not) are kept (:mod:`api.ttl_cache`).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from api.ttl_cache import LoadingCache
from setu import names
from setu.envelope import H_TOPIC
from setu.errors import NotFound
from setu.model import Topic

Loader = Callable[[str, str], Awaitable[Topic | None]]


@dataclass(frozen=True, slots=True)
class CachedTopic:
    topic: Topic
    # Where the API writes the topic's records, and the headers each record gets besides its
    # own: the topic's ingest topic, or the shared ingest log with the topic named in a header
    # (decision 0010).
    ingest_topic: str
    ingest_headers: tuple[tuple[str, bytes], ...] = ()

    def with_ingest_headers(self, headers: list[tuple[str, bytes]]) -> list[tuple[str, bytes]]:
        """``headers`` (a new record's, extended in place) plus :attr:`ingest_headers`."""
        headers.extend(self.ingest_headers)
        return headers


def cached(topic: Topic, shared_log: str | None) -> CachedTopic:
    """The produce path's view of ``topic``; ``shared_log``: the shared ingest log, when
    ``SETU_INGEST_LOG=shared``."""
    if shared_log is None:
        return CachedTopic(topic, names.ingest_topic(topic.project, topic.name))
    main = names.main_topic(topic.project, topic.name).encode()
    return CachedTopic(topic, shared_log, ((H_TOPIC, main),))


class TopicCache:
    def __init__(
        self,
        load: Loader,
        *,
        ttl_s: float = 5.0,
        negative_ttl_s: float = 1.0,
        max_entries: int = 10_000,
        shared_log: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._load = load
        self._shared_log = shared_log
        self._cache: LoadingCache[tuple[str, str], CachedTopic] = LoadingCache(
            self._fetch,
            ttl_s=ttl_s,
            negative_ttl_s=negative_ttl_s,
            max_entries=max_entries,
            clock=clock,
        )

    async def get(self, project: str, topic: str) -> CachedTopic:
        """The topic, from memory when fresh; raises NotFound when it does not exist. Names
        that no topic can have are refused before any lookup, so they take no cache entry."""
        found = None
        if names.is_name(project) and names.is_name(topic):
            found = await self._cache.get((project, topic))
        if found is None:
            raise NotFound(
                f"topic {names.shown(topic)} not found in project {names.shown(project)}"
            )
        return found

    def invalidate(self, project: str, topic: str) -> None:
        self._cache.invalidate((project, topic))

    def __len__(self) -> int:
        return len(self._cache)

    async def _fetch(self, key: tuple[str, str]) -> CachedTopic | None:
        topic = await self._load(*key)
        return None if topic is None else cached(topic, self._shared_log)
