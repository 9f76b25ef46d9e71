"""A process's Redis client under more concurrent commands than its pool has connections:
the commands wait for a connection and succeed (state/redis_clients.py). A worker serving a
hundred subscriptions sent more than redis-py's default 100 at once at a takeover, and each
command the pool refused stopped a subscription."""

from __future__ import annotations

import asyncio
import uuid

import pytest
import redis
import redis.asyncio

from setu.settings import Settings
from state.redis_clients import async_redis, close

pytestmark = pytest.mark.integration


def pipelined(redis_url: str) -> tuple[redis.asyncio.Redis, str]:  # type: ignore[type-arg]
    """The pipelined client as a worker builds it, its connections named for Redis to count."""
    name = f"pipelined-{uuid.uuid4().hex[:12]}"
    settings = Settings(redis_url=redis_url)
    return async_redis(
        settings, redis_url, pipelined=True, socket_timeout=10, client_name=name
    ), name


async def connections_named(redis_url: str, name: str) -> int:
    """How many connections Redis has open under ``name`` (``CLIENT LIST``). A pool opens
    one only when none of its own is free, so this is the most it held at once."""
    probe: redis.asyncio.Redis = redis.asyncio.Redis.from_url(redis_url)  # type: ignore[type-arg]
    try:
        return sum(1 for c in await probe.client_list() if c.get("name") == name)
    finally:
        await probe.aclose()


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


async def test_commands_asked_together_from_many_tasks_share_a_few_round_trips(
    redis_url: str,
) -> None:
    # Given the pipelined client, whose connections Redis counts
    client, name = pipelined(redis_url)
    key = f"pipelined-{uuid.uuid4().hex}"
    try:
        # When 2,000 tasks each ask for one increment at once
        answers = await asyncio.gather(*(client.incr(key) for _ in range(2000)))
        # Then each got its own answer, in the order asked, through a handful of round trips
        assert answers == list(range(1, 2001))
        assert (opened := await connections_named(redis_url, name)) <= 8, opened
        assert int(await client.get(key) or 0) == 2000
    finally:
        await client.delete(key)
        await close(client)


async def test_a_failing_command_fails_alone_and_scripts_survive_a_flushed_cache(
    redis_url: str,
) -> None:
    settings = Settings(redis_url=redis_url)
    client = async_redis(settings, redis_url, pipelined=True, socket_timeout=10)
    key = f"pipelined-{uuid.uuid4().hex}"
    try:
        await client.set(key, "text")
        # A command Redis refuses (a list command on a string) fails; those beside it do not
        results = await asyncio.gather(
            client.get(key), client.lpush(key, "x"), client.strlen(key), return_exceptions=True
        )
        assert results[0] == b"text"
        assert isinstance(results[1], redis.ResponseError)
        assert results[2] == 4
        # A script runs, also once Redis forgot it (loaded again on its NOSCRIPT answer)
        script = client.register_script("return redis.call('STRLEN', KEYS[1])")
        assert await script(keys=[key]) == 4
        await client.script_flush()
        assert await script(keys=[key]) == 4
    finally:
        await client.delete(key)
        await close(client)


async def test_a_connection_that_fails_fails_every_command_sent_on_it(redis_url: str) -> None:
    # Given a pipelined client of a port where nothing listens
    settings = Settings(redis_url="redis://127.0.0.1:1/0")
    client = async_redis(settings, "redis://127.0.0.1:1/0", pipelined=True, socket_timeout=2)
    try:
        # Then every command asked together gets the connection's error, none hangs
        results = await asyncio.wait_for(
            asyncio.gather(*(client.get(f"k{n}") for n in range(10)), return_exceptions=True),
            30,
        )
        assert all(isinstance(r, redis.ConnectionError) for r in results), results
    finally:
        await close(client)


async def test_many_callers_asking_turn_after_turn_hold_a_few_connections_at_most(
    redis_url: str,
) -> None:
    # Given the pipelined client, whose connections Redis counts
    client, name = pipelined(redis_url)
    key = f"pipelined-{uuid.uuid4().hex}"
    # An increment Redis takes a millisecond over: a busy server, or a loop slow to read
    slow_incr = client.register_script(
        "local t = redis.call('TIME') local start = t[1] * 1000000 + t[2] "
        "repeat t = redis.call('TIME') until t[1] * 1000000 + t[2] - start > 1000 "
        "return redis.call('INCR', KEYS[1])"
    )

    async def caller(n: int) -> None:
        for i in range(20):
            await slow_incr(keys=[key])
            await asyncio.sleep((n * 7 + i) % 5 / 1000)  # callers out of step

    try:
        # When 300 callers each ask 20 times, one command after the other
        await asyncio.gather(*(caller(n) for n in range(300)))
        # Then all 6,000 were done, with no more than a few connections held at any time
        assert int(await client.get(key) or 0) == 6000
        assert (most := await connections_named(redis_url, name)) <= 4, most
    finally:
        await client.delete(key)
        await close(client)


async def test_callers_own_pipelines_go_with_the_rest_in_order_and_fail_as_pipelines_do(
    redis_url: str,
) -> None:
    client, name = pipelined(redis_url)
    key = f"pipelined-{uuid.uuid4().hex}"

    async def caller(n: int) -> list[object]:
        pipe = client.pipeline(transaction=False)
        pipe.rpush(f"{key}-{n}", "a")
        pipe.rpush(f"{key}-{n}", "b")
        pipe.lrange(f"{key}-{n}", 0, -1)
        return list(await pipe.execute())

    try:
        # When 500 callers each run a pipeline of their own at once
        answers = await asyncio.gather(*(caller(n) for n in range(500)))
        # Then each got its commands' answers, in its order, through a handful of connections
        assert answers == [[1, 2, [b"a", b"b"]]] * 500
        assert (opened := await connections_named(redis_url, name)) <= 8, opened
        # And a failing command fails the pipeline's execute, or is its answer on request
        await client.set(key, "text")
        pipe = client.pipeline(transaction=False)
        pipe.lpush(key, "x")
        pipe.get(key)
        with pytest.raises(redis.ResponseError):
            await pipe.execute()
        pipe.lpush(key, "x")
        pipe.get(key)
        refused, value = await pipe.execute(raise_on_error=False)
        assert isinstance(refused, redis.ResponseError) and value == b"text"
    finally:
        await client.delete(key, *(f"{key}-{n}" for n in range(500)))
        await close(client)
