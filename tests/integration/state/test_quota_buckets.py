"""Produce-quota buckets in Redis (state/quota_buckets.py): burst, refill, debt, leases, and
one bucket shared by every client."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from api.quotas import QuotaGate
from setu.errors import RateLimited
from setu.model import ProduceQuota
from state.quota_buckets import RedisQuotaBuckets

pytestmark = pytest.mark.integration


@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[Redis[bytes]]:
    c: Redis[bytes] = Redis.from_url(redis_url)
    try:
        yield c
    finally:
        await c.aclose()  # type: ignore[attr-defined]


async def test_a_second_of_quota_is_admitted_then_the_rest_waits_for_the_refill(
    client: Redis[bytes],
) -> None:
    # Given 10 messages/s: one second's burst of 10
    buckets, project = RedisQuotaBuckets(client), f"q{uuid.uuid4().hex[:8]}"
    quota = ProduceQuota(messages_per_second=10)
    admitted = [(await buckets.take(project, quota, 1, 0, 0, 0)).admitted for _ in range(10)]
    assert admitted == [True] * 10
    # Then the 11th waits about a tenth of a second
    refused = await buckets.take(project, quota, 1, 0, 0, 0)
    assert not refused.admitted and 0 < refused.wait_ms <= 100
    # And once that passed it is admitted
    await asyncio.sleep(refused.wait_ms / 1000 + 0.02)
    assert (await buckets.take(project, quota, 1, 0, 0, 0)).admitted


async def test_a_request_bigger_than_the_burst_passes_once_and_leaves_a_debt(
    client: Redis[bytes],
) -> None:
    buckets, project = RedisQuotaBuckets(client), f"q{uuid.uuid4().hex[:8]}"
    quota = ProduceQuota(bytes_per_second=1_000)
    # A 3,000-byte batch on a full bucket passes; the next byte waits out the 2 s of debt
    assert (await buckets.take(project, quota, 1, 3_000, 0, 0)).admitted
    refused = await buckets.take(project, quota, 1, 1, 0, 0)
    assert not refused.admitted and 1_900 <= refused.wait_ms <= 2_001


async def test_a_lease_takes_what_is_left_up_to_the_share_asked(client: Redis[bytes]) -> None:
    buckets, project = RedisQuotaBuckets(client), f"q{uuid.uuid4().hex[:8]}"
    quota = ProduceQuota(messages_per_second=100, bytes_per_second=10_000)
    grant = await buckets.take(project, quota, 1, 100, 5, 500)
    assert (grant.extra_messages, grant.extra_bytes) == (5, 500)
    # The bucket now holds 94 messages: a request of 90 asking 10 more gets 4
    assert (await buckets.take(project, quota, 90, 0, 10, 0)).extra_messages == 4


async def test_every_client_takes_from_the_same_bucket(redis_url: str) -> None:
    project = f"q{uuid.uuid4().hex[:8]}"
    quota = ProduceQuota(messages_per_second=6)
    clients: list[Redis[bytes]] = [Redis.from_url(redis_url) for _ in range(3)]
    try:
        replicas = [RedisQuotaBuckets(c) for c in clients]
        answers = [(await r.take(project, quota, 1, 0, 0, 0)).admitted for r in replicas * 3]
    finally:
        for c in clients:
            await c.aclose()  # type: ignore[attr-defined]
    # Three replicas asking three times each: six admitted in all, not six each
    assert answers.count(True) == 6


async def test_a_burst_of_concurrent_requests_far_under_the_quota_is_all_admitted(
    client: Redis[bytes],
) -> None:
    # Given a replica's gate on a quota of 1,000 messages/s
    project, quota = f"q{uuid.uuid4().hex[:8]}", ProduceQuota(messages_per_second=1_000)

    async def quota_of(_: str) -> ProduceQuota:
        return quota

    gate = QuotaGate(RedisQuotaBuckets(client), quota_of)

    async def one() -> bool:
        try:
            await gate.admit(project, 1, 200)
        except RateLimited:
            return False
        return True

    # When 200 requests of one message arrive at once (a fifth of a second's quota)
    answers = await asyncio.gather(*(one() for _ in range(200)))
    # Then every one is admitted: concurrent requests share one lease rather than each taking
    # a share of the bucket of its own (which refused most of them)
    assert answers.count(True) == 200
