"""A process's Redis client under more concurrent commands than its pool has connections:
the commands wait for a connection and succeed (state/redis_clients.py). A worker serving a
hundred subscriptions sent more than redis-py's default 100 at once at a takeover, and each
command the pool refused stopped a subscription."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from setu.settings import Settings
from state.redis_clients import async_redis, close

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("max_connections", [100, 3])
async def test_commands_beyond_the_pool_wait_for_a_connection_instead_of_failing(
    redis_url: str, max_connections: int
) -> None:
    # Given a client as Setu's processes build it
    settings = Settings(redis_url=redis_url, redis_max_connections=max_connections)
    client = async_redis(settings, redis_url, socket_timeout=10)
    key = f"pool-test-{uuid.uuid4().hex}"
    try:
        # When more commands than its pool has connections run at once, each holding its
        # connection for a while (a blocking pop on an empty list)
        commands = [client.blpop([f"{key}-{n}"], timeout=0.2) for n in range(150)]
        results = await asyncio.gather(*commands)
        # Then every one completed (the pop timed out, as nothing was pushed)
        assert results == [None] * 150
        # And the client works on
        assert await client.incr(key) == 1
        await client.delete(key)
    finally:
        await close(client)
