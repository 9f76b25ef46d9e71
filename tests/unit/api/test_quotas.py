"""The produce-quota gate on one replica (api/quotas.py): leases, 429s, Redis trouble."""

from __future__ import annotations

import asyncio

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from api.quotas import LEASE_SHARE, LEASE_TTL_S, QuotaGate
from setu.errors import RateLimited
from setu.model import ProduceQuota
from state.quota_buckets import Grant


class ScriptedBuckets:
    """Answers each take with the next grant given; records what was asked."""

    def __init__(self, *grants: Grant | Exception) -> None:
        self.grants = list(grants)
        self.asked: list[tuple[int, int, int, int]] = []

    async def take(
        self, project: str, quota: ProduceQuota, messages: int, nbytes: int, em: int, eb: int
    ) -> Grant:
        self.asked.append((messages, nbytes, em, eb))
        grant = self.grants.pop(0)
        if isinstance(grant, Exception):
            raise grant
        return grant


class SlowBuckets(ScriptedBuckets):
    """A ScriptedBuckets whose answers wait for ``go``, so that requests pile up meanwhile."""

    def __init__(self, *grants: Grant | Exception) -> None:
        super().__init__(*grants)
        self.go = asyncio.Event()

    async def take(
        self, project: str, quota: ProduceQuota, messages: int, nbytes: int, em: int, eb: int
    ) -> Grant:
        await self.go.wait()
        return await super().take(project, quota, messages, nbytes, em, eb)


async def outcomes(g: QuotaGate, buckets: SlowBuckets, count: int) -> list[str]:
    """``count`` concurrent one-message requests, once they all wait: each one's outcome."""

    async def one() -> str:
        try:
            await g.admit("p", 1, 1)
        except RateLimited as refused:
            return f"429 after {refused.retry_after_s}"
        return "admitted"

    tasks = [asyncio.create_task(one()) for _ in range(count)]
    await asyncio.sleep(0)
    buckets.go.set()
    return list(await asyncio.gather(*tasks))


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def gate(buckets: ScriptedBuckets, quota: ProduceQuota, clock: Clock | None = None) -> QuotaGate:
    async def quota_of(project: str) -> ProduceQuota:
        return quota

    return QuotaGate(buckets, quota_of, clock=clock or Clock())


async def test_a_project_without_a_quota_never_asks_redis() -> None:
    buckets = ScriptedBuckets()
    await gate(buckets, ProduceQuota()).admit("p", 10_000, 10**9)
    assert buckets.asked == []


async def test_an_admitted_request_leases_a_share_spent_locally_until_it_runs_out() -> None:
    # Given 1,000 messages/s: a lease is 50 messages
    buckets = ScriptedBuckets(Grant(True, extra_messages=50), Grant(True, extra_messages=50))
    g = gate(buckets, ProduceQuota(messages_per_second=1_000))
    await g.admit("p", 1, 100)
    assert buckets.asked == [(1, 100, int(1_000 * LEASE_SHARE), 0)]
    # Then the next 50 messages need no round trip, the 51st does
    for _ in range(50):
        await g.admit("p", 1, 100)
    assert len(buckets.asked) == 1
    await g.admit("p", 1, 100)
    assert len(buckets.asked) == 2


async def test_a_lease_expires_so_a_quiet_replica_does_not_hoard_quota() -> None:
    clock = Clock()
    buckets = ScriptedBuckets(Grant(True, extra_messages=50), Grant(True, extra_messages=50))
    g = gate(buckets, ProduceQuota(messages_per_second=1_000), clock)
    await g.admit("p", 1, 1)
    clock.now += LEASE_TTL_S
    await g.admit("p", 1, 1)
    assert len(buckets.asked) == 2


async def test_over_the_quota_is_429_with_a_whole_second_retry_after() -> None:
    buckets = ScriptedBuckets(Grant(False, wait_ms=1_200))
    g = gate(buckets, ProduceQuota(messages_per_second=5, bytes_per_second=1_000))
    with pytest.raises(RateLimited) as refused:
        await g.admit("p", 3, 10)
    assert refused.value.headers() == [("Retry-After", "2")]
    assert "5 messages/s, 1000 bytes/s" in refused.value.message


async def test_when_redis_does_not_answer_the_request_is_admitted_and_counted() -> None:
    counted: list[int] = []
    buckets = ScriptedBuckets(RedisConnectionError("down"))

    async def quota_of(project: str) -> ProduceQuota:
        return ProduceQuota(messages_per_second=5)

    g = QuotaGate(buckets, quota_of, on_unchecked=lambda: counted.append(1))
    await g.admit("p", 1, 1)
    assert counted == [1]


async def test_admit_now_admits_only_what_needs_no_round_trip() -> None:
    # Given 1,000 messages/s (a lease is 50), and a quota not yet known on this replica
    buckets = ScriptedBuckets(Grant(True, extra_messages=50))
    known: dict[str, ProduceQuota] = {}

    async def quota_of(project: str) -> ProduceQuota:
        known[project] = ProduceQuota(messages_per_second=1_000)
        return known[project]

    g = QuotaGate(buckets, quota_of, cached_quota_of=known.get, clock=Clock())
    # When the quota is unknown, or known with no lease yet, then admit_now declines
    assert not g.admit_now("p", 1, 100)
    await g.admit("p", 1, 100)
    assert len(buckets.asked) == 1
    # Then the lease covers the next 50 without Redis, and the 51st goes back to admit()
    assert all(g.admit_now("p", 1, 100) for _ in range(50))
    assert not g.admit_now("p", 1, 100)
    assert len(buckets.asked) == 1


async def test_admit_now_admits_a_project_without_a_quota() -> None:
    g = QuotaGate(
        ScriptedBuckets(),
        lambda _: None,
        cached_quota_of=lambda _: ProduceQuota(),  # type: ignore[arg-type,return-value]
    )
    assert g.admit_now("p", 10_000, 10**9)


async def test_concurrent_requests_wait_for_one_take_and_spend_its_lease() -> None:
    buckets = SlowBuckets(Grant(True, extra_messages=50), Grant(True, extra_messages=50))
    g = gate(buckets, ProduceQuota(messages_per_second=1_000))
    assert await outcomes(g, buckets, 40) == ["admitted"] * 40
    assert len(buckets.asked) == 1


async def test_what_is_left_of_a_lease_is_kept_when_a_bigger_request_takes_again() -> None:
    buckets = ScriptedBuckets(Grant(True, extra_messages=50), Grant(True, extra_messages=50))
    g = gate(buckets, ProduceQuota(messages_per_second=1_000))
    await g.admit("p", 1, 1)
    await g.admit("p", 60, 1)  # more than the lease of 50: a take of its own
    for _ in range(100):  # the first lease and the second's, both spent locally
        await g.admit("p", 1, 1)
    assert len(buckets.asked) == 2


async def test_requests_waiting_on_a_refused_take_are_refused_with_it() -> None:
    buckets = SlowBuckets(Grant(False, wait_ms=1_500))
    g = gate(buckets, ProduceQuota(messages_per_second=5))
    assert await outcomes(g, buckets, 10) == ["429 after 2"] * 10
    assert len(buckets.asked) == 1


async def test_requests_waiting_on_a_take_redis_did_not_answer_are_admitted_with_it() -> None:
    buckets = SlowBuckets(RedisConnectionError("down"))
    g = gate(buckets, ProduceQuota(messages_per_second=5))
    assert await outcomes(g, buckets, 10) == ["admitted"] * 10
    assert len(buckets.asked) == 1
