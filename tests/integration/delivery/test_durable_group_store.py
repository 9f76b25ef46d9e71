"""The group-state store behind its changelog (state/durable_groups.py) on real Redis: what a
takeover rebuilds, and how an owner notices that Redis forgot. The shared changelog is a list
per partition here; the Kafka form is run end to end by test_redis_forgets.py."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Sequence

import pytest
from redis.asyncio import Redis

from delivery.watch import StateWatch
from setu.ordering.state import EMPTY_COUNTS, GroupState, StateLost, StateWrite
from setu.ordering.tiers import DLQ
from state import keys
from state.changelog import Entry, Keyed, born_record, entry_of
from state.durable_groups import DurableGroupStore
from state.groups import RedisGroupStore
from state.shared_changelog import SharedChangelogs, SubscriptionChangelog

pytestmark = pytest.mark.integration


class ListLog:
    """A shared changelog topic kept in lists, one per partition."""

    def __init__(self) -> None:
        self.partitions: dict[int, list[Keyed]] = {}

    async def send(self, topic: str, partition: int, records: Sequence[Keyed]) -> None:
        self.partitions.setdefault(partition, []).extend(records)

    async def read(self, topic: str, partition: int, start: int) -> tuple[list[Entry], int, int]:
        held = self.partitions.get(partition, [])
        entries = [
            entry
            for offset, (key, value, headers) in enumerate(held)
            if offset >= start and (entry := entry_of(key, value, headers, offset)) is not None
        ]
        return entries, 0, len(held)


def ListChangelog(subscription: str = "s") -> SubscriptionChangelog:  # noqa: N802
    """Subscription ``subscription``'s changelog on a shared changelog kept in lists."""
    log = ListLog()
    return SubscriptionChangelog(
        "setu.p.t.groups", subscription, log.send, SharedChangelogs(log.read)
    )


@pytest.fixture
async def redis_client(redis_url: str) -> AsyncIterator[tuple[Redis[bytes], str]]:
    project = f"t{uuid.uuid4().hex[:10]}"
    client: Redis[bytes] = Redis.from_url(redis_url)
    try:
        yield client, project
    finally:
        found = [k async for k in client.scan_iter(match=keys.subscription_pattern(project, "s"))]
        if found:
            await client.delete(*found)
        await client.aclose()  # type: ignore[attr-defined]


def parked(n: int, version: int = 1) -> GroupState:
    counts = list(EMPTY_COUNTS)
    counts[DLQ] = n
    return GroupState(counts=tuple(counts), head="a-1", dlq_from=4, version=version, failed_at_ms=9)


async def forget(client: Redis[bytes], project: str) -> None:
    await forget_subscription(client, project, "s")


async def forget_subscription(client: Redis[bytes], project: str, name: str) -> None:
    found = [k async for k in client.scan_iter(match=keys.subscription_pattern(project, name))]
    if found:
        await client.delete(*found)


async def test_a_takeover_after_redis_forgot_rebuilds_groups_and_requests(
    redis_client: tuple[Redis[bytes], str],
) -> None:
    client, project = redis_client
    log = ListChangelog()
    # Given an owner that parked group g and an operator who asked for h's release
    first = DurableGroupStore(RedisGroupStore(client, project, "s"), log)
    epoch = await first.claim(0)
    await first.apply(StateWrite(0, "g", touches_group=True, state=parked(3)), epoch)
    await first.request_release(0, ["h"], [12])
    # When Redis forgets everything and another worker takes the partition over
    await forget(client, project)
    second = DurableGroupStore(RedisGroupStore(client, project, "s"), log)
    new_epoch = await second.claim(0)
    # Then Redis holds the group, the request and the letter again, under a newer epoch
    snapshot = await second.load(0)
    assert snapshot.states == {"g": parked(3)}
    assert snapshot.release_requests == {"h"}
    assert snapshot.pending_releases == {12}
    assert new_epoch > epoch
    assert second.rebuilt_after_loss == 1
    assert await second.redis.loaded() == {0}


async def owner_of_a_parked_group(
    client: Redis[bytes], project: str
) -> tuple[DurableGroupStore, int]:
    """An owner of partition 1 that parked group g; its epoch."""
    store = DurableGroupStore(RedisGroupStore(client, project, "s"), ListChangelog())
    epoch = await store.claim(1)
    await store.apply(StateWrite(1, "g", touches_group=True, state=parked(1)), epoch)
    return store, epoch


async def test_an_owner_notices_redis_lost_its_latest_writes(
    redis_client: tuple[Redis[bytes], str],
) -> None:
    client, project = redis_client
    store, epoch = await owner_of_a_parked_group(client, project)
    await store.verify(1)  # all there
    # Given Redis comes back without its last write (a replica that lagged)
    await client.set(keys.owner_writes(project, "s", 1), 0)
    # Then the next check, and the next write, say so
    with pytest.raises(StateLost):
        await store.verify(1)
    with pytest.raises(StateLost):
        await store.apply(
            StateWrite(1, "g", touches_group=True, expected_version=1, state=parked(2, 2)),
            epoch,
        )


async def test_a_batch_with_nothing_left_to_write_is_not_taken_for_lost_state(
    redis_client: tuple[Redis[bytes], str],
) -> None:
    client, project = redis_client
    store = DurableGroupStore(RedisGroupStore(client, project, "s"), ListChangelog())
    epoch = await store.claim(0)
    await store.apply(StateWrite(0, "g", touches_group=True, state=parked(1)), epoch)
    # Given a batch whose writes were all dropped (their engine was replaced meanwhile), so it
    # carries the partition's epoch and nothing to write
    await store.apply_batch({}, [], {0: epoch})
    # Then Redis, which was given nothing, is not taken for having lost a write
    await store.verify(0)
    await store.apply(
        StateWrite(0, "g", touches_group=True, expected_version=1, state=parked(2, 2)), epoch
    )
    await store.verify(0)


class SlowRead(RedisGroupStore):
    """Redis whose answer to the owner's check arrives only once ``answer`` is set (``read``
    is set once it was read)."""

    read: asyncio.Event
    answer: asyncio.Event

    async def writes_since_claim(self, partition: int) -> tuple[int, int]:
        held = await super().writes_since_claim(partition)
        self.read.set()
        await self.answer.wait()
        return held


async def test_a_write_completing_during_a_check_is_not_taken_for_lost_state(
    redis_client: tuple[Redis[bytes], str],
) -> None:
    client, project = redis_client
    redis_store = SlowRead(client, project, "s")
    redis_store.read, redis_store.answer = asyncio.Event(), asyncio.Event()
    store = DurableGroupStore(redis_store, ListChangelog())
    epoch = await store.claim(0)
    # Given the periodic check has read Redis's count, and its answer is on its way
    check = asyncio.create_task(store.verify(0))
    await redis_store.read.wait()
    # When a write completes meanwhile (Redis counts it first, the owner after)
    await store.apply(StateWrite(0, "g", touches_group=True, state=parked(1)), epoch)
    redis_store.answer.set()
    # Then the check does not take Redis for having lost it
    await check


async def test_a_partition_from_before_the_changelog_is_seeded_from_redis(
    redis_client: tuple[Redis[bytes], str],
) -> None:
    client, project = redis_client
    # Given a group parked by a version without a changelog (Redis only)
    redis_store = RedisGroupStore(client, project, "s")
    await redis_store.apply(StateWrite(2, "g", touches_group=True, state=parked(2)))
    log = ListChangelog()
    # When the first worker with a changelog takes the partition over
    await DurableGroupStore(redis_store, log).claim(2)
    # Then the changelog holds it, so a Redis that forgets afterwards loses nothing
    await forget(client, project)
    await DurableGroupStore(RedisGroupStore(client, project, "s"), log).claim(2)
    assert (await redis_store.load(2)).states == {"g": parked(2)}


async def test_a_subscription_the_api_created_takes_nothing_from_what_redis_held_before(
    redis_client: tuple[Redis[bytes], str],
) -> None:
    client, project = redis_client
    # Given Redis still holding a parked group under the name (a subscription deleted while
    # Redis was away, so its state was never cleared there)
    redis_store = RedisGroupStore(client, project, "s")
    await redis_store.apply(StateWrite(2, "g", touches_group=True, state=parked(2)))
    # When the API creates a subscription of that name (its born record) and a worker claims
    log = ListChangelog()
    record = born_record()
    await log.append(2, [record])
    store = DurableGroupStore(redis_store, log)
    await store.claim(2)
    # Then the new subscription has no parked group, in Redis or in its changelog
    assert (await redis_store.load(2)).states == {}
    assert (await log.replay(2)).states == {}


async def test_the_workers_one_reading_notices_lost_writes_and_requested_releases(
    redis_client: tuple[Redis[bytes], str],
) -> None:
    client, project = redis_client
    # Given an owner of partition 1 watched by its worker's reading of Redis
    store, _ = await owner_of_a_parked_group(client, project)
    watch = StateWatch(client)
    entry = watch.watch(project, "s", store)
    told: list[int | None] = []
    entry.changed = lambda: told.append(entry.version)
    await watch.read()
    entry.verify()  # all there
    before = entry.version
    await watch.read()
    assert len(told) == 1  # the first reading; the second found nothing moved
    # When an operator asks for a release (the API writes through the same store)
    await RedisGroupStore(client, project, "s").request_release(1, ["g"], [])
    await watch.read()
    # Then the reading shows the subscription's release version moved, and told its runner
    assert before is not None and entry.version == before + 1
    assert told == [before, before + 1]
    # And when Redis comes back without the owner's last write, the next reading says so
    await client.set(keys.owner_writes(project, "s", 1), 0)
    await watch.read()
    with pytest.raises(StateLost):
        entry.verify()
    # And a forgotten entry is read no more
    watch.forget(entry)
    entry.read_at = 0.0
    await watch.read()
    assert entry.read_at == 0.0


async def test_a_reading_that_finds_redis_as_before_still_notices_a_lost_new_write(
    redis_client: tuple[Redis[bytes], str],
) -> None:
    # The reading leaves values that did not move since the last one unparsed: one whose
    # Redis values are exactly as before must still be checked when the owner wrote since.
    client, project = redis_client
    store, epoch = await owner_of_a_parked_group(client, project)
    watch = StateWatch(client)
    entry = watch.watch(project, "s", store)
    await watch.read()
    await watch.read()  # nothing moved: the same finding, read again
    entry.verify()
    held_before = await client.get(keys.owner_writes(project, "s", 1))
    # When the owner writes once more, and Redis comes back without that write (its count as
    # the last reading saw it)
    await store.apply(
        StateWrite(1, "g", touches_group=True, expected_version=1, state=parked(2, 2)), epoch
    )
    await client.set(keys.owner_writes(project, "s", 1), held_before or b"0")
    await watch.read()
    # Then the reading says so
    with pytest.raises(StateLost):
        entry.verify()


async def test_the_reading_goes_on_after_redis_closed_its_connection_and_follows_new_entries(
    redis_client: tuple[Redis[bytes], str], redis_url: str
) -> None:
    client, project = redis_client
    store, _ = await owner_of_a_parked_group(client, project)
    # Given the worker's reading on a connection of its own, which has read once
    watch_client: Redis[bytes] = Redis.from_url(redis_url)
    try:
        watch = StateWatch(watch_client)
        entry = watch.watch(project, "s", store)
        await watch.read()
        entry.verify()
        # When Redis closes that connection (a restart, a failover)
        own_id = await watch_client.client_id()
        await client.client_kill_filter(_id=own_id)
        # And an operator asks for a release, and a second subscription is watched
        before = entry.version
        await RedisGroupStore(client, project, "s").request_release(1, ["g"], [])
        other = watch.watch(project, "s2", None)
        await RedisGroupStore(client, project, "s2").request_release(0, ["h"], [])
        await watch.read()
        # Then the next reading finds both, read on a new connection
        assert before is not None and entry.version == before + 1
        assert other.version == 1
        assert await watch_client.client_id() != own_id
    finally:
        await watch_client.aclose()  # type: ignore[attr-defined]
        await forget_subscription(client, project, "s2")
