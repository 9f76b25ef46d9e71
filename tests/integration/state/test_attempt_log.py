"""The attempt log's contract on Redis and on the stub (state/attempt_log.py)."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import orjson
import pytest
from redis.asyncio import Redis

from state import keys
from state.attempt_log import HOUR_MS, AttemptLog, RedisAttemptLog, StubAttemptLog
from tests.integration.contracts import Backing, contract

pytestmark = pytest.mark.integration


class Clock:
    now = 100 * HOUR_MS + 5

    def __call__(self) -> int:
        return self.now


def redis_attempt_logs(backing: Backing) -> Callable[[int, Clock], AttemptLog]:
    client, project = backing.async_client(), backing.project("a")
    return lambda hours, clock: RedisAttemptLog(client, project, "s", hours, clock)


make = contract(
    {
        "stub": lambda backing: lambda hours, clock: StubAttemptLog(hours, clock),
        "redis": redis_attempt_logs,
    }
)


def line(t: int, n: int) -> bytes:
    return orjson.dumps({"t": t, "a": n})


async def test_entries_of_many_flushes_and_hours_read_back_in_order(
    make: Callable[[int, Clock], AttemptLog],
) -> None:
    clock = Clock()
    log = make(24, clock)
    # Given entries of two messages over three flushes, the last one an hour later
    await log.append([("m1", line(clock.now, 1)), ("m2", line(clock.now, 1))])
    await log.append([("m1", line(clock.now + 1, 2))])
    clock.now += HOUR_MS
    await log.append([("m1", line(clock.now, 3))])
    # Then each message reads back its own, oldest first; an unknown one reads nothing
    assert [e["a"] for e in await log.read("m1")] == [1, 2, 3]
    assert [e["a"] for e in await log.read("m2")] == [1]
    assert await log.read("m3") == []


async def test_entries_older_than_the_retention_are_not_read(
    make: Callable[[int, Clock], AttemptLog],
) -> None:
    clock = Clock()
    log = make(2, clock)
    await log.append([("m1", line(clock.now, 1))])
    clock.now += 2 * HOUR_MS  # exactly as old as the retention: still there
    assert [e["a"] for e in await log.read("m1")] == [1]
    clock.now += 1
    assert await log.read("m1") == []


async def test_an_hour_of_entries_expires_as_one_key(redis_url: str) -> None:
    client: Redis[bytes] = Redis.from_url(redis_url)
    project = f"a{uuid.uuid4().hex[:10]}"
    try:
        clock = Clock()
        await RedisAttemptLog(client, project, "s", 3, clock).append([("m1", line(clock.now, 1))])
        ttl = await client.ttl(keys.attempts(project, "s", clock.now // HOUR_MS))
        assert 3 * 3600 < ttl <= 4 * 3600
    finally:
        await client.delete(keys.attempts(project, "s", Clock.now // HOUR_MS))
        await client.aclose()  # type: ignore[attr-defined]
