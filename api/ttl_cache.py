"""A small in-memory cache in front of a slow lookup (the database), for the hot paths: topic
metadata on produce (``api.topic_cache``) and API keys on every request (``api.auth``).

A found value is trusted for ``ttl_s``, a miss (None) for ``negative_ttl_s``; concurrent misses
on one key share a single load; at most ``max_entries`` are kept, the oldest written going
first, so a flood of distinct unknown keys costs bounded memory.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Hashable
from functools import partial
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class LoadingCache(Generic[K, V]):
    def __init__(
        self,
        load: Callable[[K], Awaitable[V | None]],
        *,
        ttl_s: float,
        negative_ttl_s: float,
        max_entries: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._load = load
        self._ttl_s = ttl_s
        self._negative_ttl_s = negative_ttl_s
        self._max_entries = max_entries
        self._clock = clock
        self._entries: dict[K, tuple[float, V | None]] = {}
        self._loading: dict[K, asyncio.Task[V | None]] = {}

    async def get(self, key: K) -> V | None:
        """The value, from memory when fresh, else loaded (None when there is none)."""
        entry = self._entries.get(key)
        if entry is not None and entry[0] > self._clock():
            return entry[1]
        task = self._loading.get(key)
        if task is None:
            # A task of its own, so a caller that goes away does not cancel the others' load.
            task = asyncio.create_task(self._fetch(key))
            self._loading[key] = task
            task.add_done_callback(partial(self._finished, key))
        return await asyncio.shield(task)

    def cached(self, key: K) -> tuple[bool, V | None]:
        """(True, value) when a fresh value is in memory, else (False, None); never loads."""
        entry = self._entries.get(key)
        if entry is not None and entry[0] > self._clock():
            return True, entry[1]
        return False, None

    def invalidate(self, key: K) -> None:
        self._entries.pop(key, None)

    def __len__(self) -> int:
        return len(self._entries)

    async def _fetch(self, key: K) -> V | None:
        value = await self._load(key)
        ttl = self._ttl_s if value is not None else self._negative_ttl_s
        self._entries.pop(key, None)  # written again: now the newest
        if len(self._entries) >= self._max_entries:
            self._evict()
        self._entries[key] = (self._clock() + ttl, value)
        return value

    def _evict(self) -> None:
        """Drops the stale entries, or else the oldest tenth."""
        now = self._clock()
        stale = [k for k, (until, _) in self._entries.items() if until <= now]
        if not stale:
            stale = list(self._entries)[: max(1, self._max_entries // 10)]
        for k in stale:
            del self._entries[k]

    def _finished(self, key: K, task: asyncio.Task[V | None]) -> None:
        self._loading.pop(key, None)
        if not task.cancelled():
            task.exception()  # retrieved: every waiter already got it
