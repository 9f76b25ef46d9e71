"""The workers' reports and heartbeats: the same contract on Redis and on the stub."""

from __future__ import annotations

import uuid

import pytest
import redis
from redis.asyncio import Redis

from state.workers import STATS_FRESH_MS, RedisWorkers, StubWorkers, WorkerReports, is_alive
from tests.integration.contracts import contract

pytestmark = pytest.mark.integration


reports = contract(
    {
        "stub": lambda backing: StubWorkers(),
        "redis": lambda backing: RedisWorkers(backing.async_client()),
    }
)


async def test_the_fresh_reports_of_a_subscription_are_each_workers_latest(
    reports: WorkerReports,
) -> None:
    project = f"w{uuid.uuid4().hex[:8]}"
    now = 1_000_000
    # Given two workers' reports, one of them replaced, and a report of another subscription
    await reports.report(project, "s", "a", {"in_flight": 1, "at": now - 1_000})
    await reports.report(project, "s", "a", {"in_flight": 2, "at": now})
    await reports.report(project, "s", "b", {"in_flight": 5, "at": now - STATS_FRESH_MS - 1})
    await reports.report(project, "other", "c", {"in_flight": 9, "at": now})
    # Then only a's latest is fresh (b's is too old)
    assert await reports.fresh(project, "s", now) == [{"in_flight": 2, "at": now}]
    # And a forgotten worker's report is gone
    await reports.forget(project, "s", "a")
    assert await reports.fresh(project, "s", now) == []
    assert await reports.fresh(project, "other", now) == [{"in_flight": 9, "at": now}]


async def test_a_heartbeat_lives_until_stopped(redis_url: str) -> None:
    client: Redis[bytes] = Redis.from_url(redis_url)
    probe: redis.Redis[bytes] = redis.Redis.from_url(redis_url)
    worker = f"w{uuid.uuid4().hex[:8]}"
    try:
        await RedisWorkers(client).beat(worker, 10_000)
        assert is_alive(probe, worker)
        await RedisWorkers(client).stop_beating(worker)
        assert not is_alive(probe, worker)
    finally:
        await client.aclose()  # type: ignore[attr-defined]
        probe.close()
