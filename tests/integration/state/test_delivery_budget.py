"""The shared call budget's scripts on a real Redis (state/delivery_budget.py)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from state.delivery_budget import RedisDeliveryBudget

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="function")]


@pytest.fixture
async def budget(redis_url: str) -> AsyncIterator[RedisDeliveryBudget]:
    client = aioredis.Redis.from_url(redis_url)
    try:
        yield RedisDeliveryBudget(client, f"b{uuid.uuid4().hex[:8]}", "s")
    finally:
        await client.aclose()


async def test_slots_are_shared_fairly_and_never_beyond_the_limit(
    budget: RedisDeliveryBudget,
) -> None:
    # Given one worker alone: it gets what it asks, up to the limit
    assert await budget.share("a", 10, 0, 8) == 8
    # When a second asks while the first holds all 8, it gets nothing yet
    assert await budget.share("b", 10, 0, 8) == 0
    # Then the first, renewing with 8 calls going, keeps its busy slots counted...
    assert await budget.share("a", 10, 8, 8) == 4
    assert await budget.share("b", 10, 0, 8) == 0
    # ...and once its calls are down to its fair half, the second gets the rest
    assert await budget.share("a", 10, 4, 8) == 4
    assert await budget.share("b", 10, 0, 8) == 4
    # A worker wanting little leaves the rest to the one wanting more
    assert await budget.share("b", 1, 1, 8) == 1
    assert await budget.share("a", 10, 4, 8) == 7
    # And a worker that leaves frees its slots at once
    await budget.leave("a")
    assert await budget.share("b", 10, 1, 8) == 8


async def test_the_rate_bucket_is_one_for_every_worker(budget: RedisDeliveryBudget) -> None:
    # A bucket of 10/s holds one call (a tenth of a second) when full
    first = await budget.take_rate(10, 1, 1, 0)
    second = await budget.take_rate(10, 1, 1, 0)
    assert first.admitted and not second.admitted
    assert 0 < second.wait_ms <= 100


async def test_an_idle_workers_longer_entry_is_not_cut_short_by_a_busy_ones(
    budget: RedisDeliveryBudget,
) -> None:
    client = budget._client
    key = budget._slots_key
    # Given an idle worker whose headroom entry lives 10 s
    assert await budget.share("idle", 4, 0, 8, ttl_ms=10_000) == 4
    seconds, micros = await client.time()
    now_ms = seconds * 1000 + micros // 1000
    expires = int((await client.hget(key, "idle") or b"").decode().split(",")[2])
    assert 9_000 <= expires - now_ms <= 10_000
    # When a busy worker speaks with the usual 3 s
    assert await budget.share("busy", 10, 2, 8) == 4
    # Then the hash still outlives the idle entry
    assert await client.pttl(key) > 10_000
