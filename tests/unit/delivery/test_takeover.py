"""Taking a partition index over (delivery/takeover.py): which tiers it finds with nothing to
read, which a shared tiers reader then does not fetch (delivery/views.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from confluent_kafka import TopicPartition

from delivery.takeover import TiersMissing, take_over
from setu import names
from setu.ordering import groups
from setu.ordering.state import GroupState
from setu.ordering.tiers import DLQ, MAIN, topics_by_tier
from state.groups_stub import StubGroupStore, _Partition
from state.kafka_reader import Tails
from tests.unit.delivery.sim import subscription


class Watermarks:
    """A reader whose tails are empty, with each partition's first and end offsets."""

    def __init__(self, marks: dict[str, tuple[int, int]]) -> None:
        self.marks = marks  # topic -> (first offset, end offset)

    async def tails_together(self, starts: Sequence[TopicPartition]) -> Tails:
        tails = Tails()
        for tp in starts:
            low, end = self.marks[tp.topic]
            tails.lows[(tp.topic, tp.partition)] = low
            tails.ends[(tp.topic, tp.partition)] = end
        return tails


async def test_tiers_whose_reading_starts_at_their_end_are_idle() -> None:
    sub = subscription()
    topics = {tier: topic for topic, tier in topics_by_tier(sub).items()}
    rq1, rq2 = (
        names.retry_topic(sub.project, sub.name, 1),
        names.retry_topic(sub.project, sub.name, 2),
    )
    marks = {
        rq1: (0, 10),  # committed at its end: nothing to read
        rq2: (0, 10),  # committed below its end: records to read
        topics[DLQ]: (4, 4),  # never committed, empty (retention removed all): nothing
    }
    for tier, topic in topics.items():
        if tier not in (MAIN, DLQ) and topic not in marks:
            marks[topic] = (7, 9)  # never committed, holds records
    committed: dict[int, int | None] = {tier: None for tier in topics}
    committed[MAIN] = 3
    committed[1], committed[2] = 10, 8
    reader = Watermarks(marks)
    plan = await take_over(
        sub,
        0,
        committed,
        topics,
        StubGroupStore(),
        reader,
        now_ms=0,  # type: ignore[arg-type]
    )
    assert plan.idle == {1, DLQ}
    assert MAIN not in plan.idle


async def test_a_dlq_read_again_for_a_released_dead_letter_is_not_idle() -> None:
    sub = subscription()
    topics = {tier: topic for topic, tier in topics_by_tier(sub).items()}
    marks = {topic: (0, 10) for tier, topic in topics.items() if tier != MAIN}
    committed: dict[int, int | None] = dict.fromkeys(topics, 10)
    # Nothing released: the DLQ, read to its end, is idle
    plan = await take_over(sub, 0, committed, topics, StubGroupStore(), Watermarks(marks), 0)  # type: ignore[arg-type]
    assert DLQ in plan.idle
    # An operator released the dead letter at offset 6: the DLQ is read again from there
    store = StubGroupStore()
    await store.request_release(0, [], [6])
    plan = await take_over(sub, 0, committed, topics, store, Watermarks(marks), 0)  # type: ignore[arg-type]
    assert plan.starts[DLQ] == 6
    assert DLQ not in plan.idle


class NoMissingReads(Watermarks):
    """Fails a read of a topic Kafka does not have, as Kafka does."""

    def __init__(self, marks: dict[str, tuple[int, int]], missing: set[str]) -> None:
        super().__init__(marks)
        self.missing = missing

    async def tails_together(self, starts: Sequence[TopicPartition]) -> Tails:
        asked = {tp.topic for tp in starts} & self.missing
        assert not asked, f"read a missing topic: {asked}"
        return await super().tails_together(starts)


async def test_missing_tiers_are_not_read_end_at_0_and_are_idle() -> None:
    # Given a subscription whose endpoint never failed: no retry tier or DLQ in Kafka
    sub = subscription()
    topics = {tier: topic for topic, tier in topics_by_tier(sub).items()}
    missing = {tier for tier in topics if tier != MAIN}
    reader = NoMissingReads({}, {topics[t] for t in missing})
    committed: dict[int, int | None] = dict.fromkeys(topics)
    store = StubGroupStore()
    # When a partition is taken over
    plan = await take_over(sub, 0, committed, topics, store, reader, 0, missing=missing)  # type: ignore[arg-type]
    # Then no tail was read, each missing tier is idle (dormant until a copy is written
    # there), and the fence says any copy there from an earlier owner is stale
    assert plan.idle == missing
    assert (await store.fences(0))[plan.epoch] == dict.fromkeys(missing, 0)


async def test_group_state_waiting_in_a_missing_tier_stops_the_takeover_before_any_write() -> None:
    # Given a group Redis says waits in rq.1, where a broker says rq.1 does not exist (its
    # metadata lags behind the worker that made it)
    sub = subscription()
    topics = {tier: topic for topic, tier in topics_by_tier(sub).items()}
    store = StubGroupStore()
    store.groups["g"] = (0, GroupState(counts=(0, 2)))
    store.partitions[0] = _Partition(failed={"g"})
    missing = {tier for tier in topics if tier != MAIN}
    reader = NoMissingReads({}, {topics[t] for t in missing})
    committed: dict[int, int | None] = dict.fromkeys(topics)
    # Then the takeover says so, and records no fence that would mark its copies stale
    with pytest.raises(TiersMissing, match=topics[1]):
        await take_over(sub, 0, committed, topics, store, reader, 0, missing=missing)  # type: ignore[arg-type]
    assert await store.fences(0) == {}


async def test_a_held_head_alone_needs_no_tier() -> None:
    # Given a group whose scheduled head waits in the main log (counted in tier 1), with no
    # follower copied to rq.1, and no retry tier in Kafka
    sub = subscription()
    topics = {tier: topic for topic, tier in topics_by_tier(sub).items()}
    store = StubGroupStore()
    store.groups["g"] = (0, groups.held("m1", 5, due_at_ms=10_000))
    store.partitions[0] = _Partition(failed={"g"})
    missing = {tier for tier in topics if tier != MAIN}
    reader = NoMissingReads({}, {topics[t] for t in missing})
    committed: dict[int, int | None] = dict.fromkeys(topics)
    # Then the partition is taken over without making any
    plan = await take_over(sub, 0, committed, topics, store, reader, 0, missing=missing)  # type: ignore[arg-type]
    assert plan.idle == missing
    assert "g" in plan.snapshot.states


class CountedLoads(StubGroupStore):
    def __init__(self) -> None:
        super().__init__()
        self.loads = 0

    async def load(self, partition: int) -> Any:
        self.loads += 1
        return await super().load(partition)


async def test_a_takeover_with_nothing_to_recover_reads_the_state_once_and_holds_its_fence() -> (
    None
):
    # Given a subscription whose endpoint never failed, taken over once before (epoch 1's
    # fence recorded)
    sub = subscription()
    topics = {tier: topic for topic, tier in topics_by_tier(sub).items()}
    missing = {tier for tier in topics if tier != MAIN}
    reader = NoMissingReads({}, {topics[t] for t in missing})
    committed: dict[int, int | None] = dict.fromkeys(topics)
    store = CountedLoads()
    await take_over(sub, 0, committed, topics, store, reader, 0, missing=missing)  # type: ignore[arg-type]
    store.loads = 0
    # When it is taken over again, with nothing to recover
    plan = await take_over(sub, 0, committed, topics, store, reader, 0, missing=missing)  # type: ignore[arg-type]
    # Then its state was read once, and the plan holds what reading it again would give:
    # both epochs' fences, and this owner's epoch with no write since its claim
    assert store.loads == 1
    again = await store.load(0)
    assert (
        plan.snapshot.fences
        == again.fences
        == {1: dict.fromkeys(missing, 0), 2: dict.fromkeys(missing, 0)}
    )
    assert plan.snapshot.owner == again.owner
    assert plan.snapshot.states == again.states
