"""The produce path's topic cache: fresh hits stay in memory, misses are short-lived."""

from __future__ import annotations

import asyncio

import pytest

from api.topic_cache import TopicCache
from setu.errors import DependencyUnavailable, NotFound
from setu.model import Topic


class FakeStore:
    def __init__(self) -> None:
        self.topics: dict[tuple[str, str], Topic] = {}
        self.loads = 0
        self.gate: asyncio.Event | None = None
        self.fail = False

    async def load(self, project: str, name: str) -> Topic | None:
        self.loads += 1
        if self.gate is not None:
            await self.gate.wait()
        if self.fail:
            raise DependencyUnavailable("database down")
        return self.topics.get((project, name))


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make() -> tuple[TopicCache, FakeStore, Clock]:
    store, clock = FakeStore(), Clock()
    store.topics[("p", "t")] = Topic("p", "t", grouped=True)
    return TopicCache(store.load, ttl_s=5, negative_ttl_s=1, clock=clock), store, clock


async def test_known_topic_is_loaded_once_within_the_ttl() -> None:
    cache, store, clock = make()
    first = await cache.get("p", "t")
    clock.now += 4.9
    second = await cache.get("p", "t")
    assert first is second
    assert first.ingest_topic == "setu.p.t.ingest"
    assert store.loads == 1


async def test_known_topic_is_reloaded_after_the_ttl() -> None:
    cache, store, clock = make()
    await cache.get("p", "t")
    clock.now += 5.1
    await cache.get("p", "t")
    assert store.loads == 2


async def test_unknown_topic_is_404_and_remembered_briefly() -> None:
    cache, store, clock = make()
    for _ in range(3):
        with pytest.raises(NotFound):
            await cache.get("p", "missing")
    assert store.loads == 1
    # When the topic appears and the short negative TTL passes, it is found
    store.topics[("p", "missing")] = Topic("p", "missing")
    clock.now += 1.1
    assert (await cache.get("p", "missing")).topic.name == "missing"


async def test_invalidate_forgets_at_once() -> None:
    cache, store, _ = make()
    with pytest.raises(NotFound):
        await cache.get("p", "new")
    store.topics[("p", "new")] = Topic("p", "new")
    cache.invalidate("p", "new")
    assert (await cache.get("p", "new")).topic.name == "new"


async def test_concurrent_misses_share_one_load() -> None:
    cache, store, _ = make()
    store.gate = asyncio.Event()
    waiters = [asyncio.create_task(cache.get("p", "t")) for _ in range(20)]
    await asyncio.sleep(0)
    store.gate.set()
    results = await asyncio.gather(*waiters)
    assert store.loads == 1
    assert all(r is results[0] for r in results)


async def test_a_cancelled_caller_does_not_cancel_the_others() -> None:
    cache, store, _ = make()
    store.gate = asyncio.Event()
    leaving = asyncio.create_task(cache.get("p", "t"))
    staying = asyncio.create_task(cache.get("p", "t"))
    await asyncio.sleep(0)
    leaving.cancel()
    store.gate.set()
    assert (await staying).topic.name == "t"


async def test_load_failure_reaches_the_caller_and_is_not_cached() -> None:
    cache, store, _ = make()
    store.fail = True
    with pytest.raises(DependencyUnavailable):
        await cache.get("p", "t")
    store.fail = False
    assert (await cache.get("p", "t")).topic.name == "t"


async def test_a_name_no_topic_can_have_is_not_found_without_a_lookup_or_an_entry() -> None:
    # Given names longer than any topic's, or with characters no name has
    cache, store, _ = make()
    for project, topic in (("p", "t" * 8_000), ("p" * 64, "t"), ("p", "T"), ("p\n", "t")):
        # Then each is a 404 that echoes a short form of the name only
        with pytest.raises(NotFound) as refused:
            await cache.get(project, topic)
        assert len(str(refused.value)) < 300
    # And neither the store nor the cache saw them
    assert store.loads == 0
    assert len(cache._cache) == 0


async def test_with_the_shared_log_a_topic_is_written_there_naming_its_main_log() -> None:
    store = FakeStore()
    store.topics[("p", "t")] = Topic("p", "t", grouped=True)
    cache = TopicCache(store.load, shared_log="setu.ingest")
    entry = await cache.get("p", "t")
    assert entry.ingest_topic == "setu.ingest"
    assert entry.with_ingest_headers([("setu-message-id", b"m")]) == [
        ("setu-message-id", b"m"),
        ("setu-topic", b"setu.p.t"),
    ]
    # Without it, a record gets no header of the kind
    plain = await TopicCache(store.load).get("p", "t")
    assert plain.with_ingest_headers([]) == []
