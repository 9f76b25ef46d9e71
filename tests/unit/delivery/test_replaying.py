"""A replay's lane on one partition (delivery/replaying.py): what it calls, in which order,
what it sets aside and gives up, and the progress it stores, against a log, a store and a
call pool of the test's own."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from delivery.engine import Attempt
from delivery.replaying import ReplayLane
from setu.envelope import Envelope
from setu.model import DeadLetterPolicy, Endpoint, RetryPolicy, Subscription
from setu.outcome import Outcome, Verdict
from setu.policies import Policies, parse_filter
from setu.replay import PartitionProgress, Replay

pytestmark = pytest.mark.asyncio

NOW = 1_000_000
DELIVERED = Outcome(Verdict.DELIVERED, status=200)
RETRY = Outcome(Verdict.RETRY, status=503)
REJECTED = Outcome(Verdict.DEAD_LETTER, status=400)


class Message:
    def __init__(self, offset: int, envelope: Envelope, timestamp_ms: int) -> None:
        self._offset = offset
        self._envelope = envelope
        self._timestamp = timestamp_ms

    def offset(self) -> int:
        return self._offset

    def timestamp(self) -> tuple[int, int]:
        return (1, self._timestamp)

    def headers(self) -> list[tuple[str, bytes]]:
        return self._envelope.kafka_headers()

    def value(self) -> bytes:
        return self._envelope.body


@dataclass
class Log:
    """One main-log partition; ``ingest`` numbers each message's ingest offset."""

    messages: list[Message] = field(default_factory=list)
    reads: int = 0

    def add(self, group: str | None, produced_at_ms: int = NOW, **more: Any) -> str:
        offset = len(self.messages)
        message_id = f"{group or 'm'}-{offset}"
        more.setdefault("ingest_partition", 0)
        more.setdefault("ingest_offset", offset)
        envelope = Envelope(
            message_id, b"{}", group_id=group, produced_at_ms=produced_at_ms, **more
        )
        self.messages.append(Message(offset, envelope, produced_at_ms + 5))
        return message_id

    def read(self, topic: str, partition: int, start: int, budget: int) -> tuple[Any, int, bool]:
        self.reads += 1
        out = self.messages[start : start + budget]
        position = start + len(out)
        return out, position, position >= len(self.messages)

    def offset_for_time(self, topic: str, partition: int, timestamp_ms: int) -> int:
        for msg in self.messages:
            if msg.timestamp()[1] >= timestamp_ms:
                return msg.offset()
        return len(self.messages)


@dataclass
class Store:
    saved: dict[int, PartitionProgress] = field(default_factory=dict)
    running: bool = True
    finished: int = 0

    def progress(self, replay_id: str) -> dict[int, PartitionProgress]:
        return {p: PartitionProgress.from_json(x.json()) for p, x in self.saved.items()}

    def save(self, replay_id: str, partition: int, progress: PartitionProgress) -> bool:
        if self.running:
            self.saved[partition] = PartitionProgress.from_json(progress.json())
        return self.running

    def finish_if_complete(self, replay_id: str) -> bool:
        self.finished += 1
        return True


@dataclass
class Owner:
    blocked: set[str] = field(default_factory=set)
    alive: bool = True
    draining: bool = False
    frontier: int | None = 10**9  # live delivery finished the log below this offset

    def blocks(self, group: str) -> bool:
        return group in self.blocked

    def delivered_below(self) -> int | None:
        return self.frontier


@dataclass
class Pool:
    """The subscription's call pool: keeps what the lane hands it, for the test to answer."""

    waiting: list[Attempt] = field(default_factory=list)
    lane: ReplayLane | None = None

    def submit(self, caller: Any, attempt: Attempt) -> None:
        self.waiting.append(attempt)

    def ids(self) -> list[str]:
        return [a.record.message_id for a in self.waiting]

    def answer(self, message_id: str, outcome: Outcome = DELIVERED) -> Attempt:
        attempt = next(a for a in self.waiting if a.record.message_id == message_id)
        self.waiting.remove(attempt)
        assert self.lane is not None
        self.lane.on_result(attempt, outcome)
        return attempt


def subscription(**changes: Any) -> Subscription:
    values: dict[str, Any] = {
        "project": "p",
        "name": "s",
        "topic": "t",
        "endpoint": Endpoint("https://hooks.example.com/x"),
        "grouped": True,
        "retry": RetryPolicy(delays_ms=(100,)),
    }
    values.update(changes)
    return Subscription(**values)


def replay(**changes: Any) -> Replay:
    values: dict[str, Any] = {
        "id": "rp_1",
        "project": "p",
        "subscription": "s",
        "from_ms": NOW - 1000,
        "to_ms": NOW + 1000,
        "partitions": 1,
        "rate_per_second": 10_000.0,
        "created_at_ms": NOW + 1000,
    }
    values.update(changes)
    return Replay(**values)


@dataclass
class Rig:
    log: Log
    store: Store
    owner: Owner
    pool: Pool
    lane: ReplayLane
    task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self.lane.run())

    async def until(self, what: str, condition: Any, turns: int = 400) -> None:
        for _ in range(turns):
            if condition():
                return
            await asyncio.sleep(0.005)
        raise AssertionError(f"never: {what} (waiting: {self.pool.ids()})")

    async def settled(self) -> PartitionProgress:
        assert self.task is not None
        await asyncio.wait_for(self.task, 5)
        return self.store.saved[0]


@pytest.fixture
def make() -> Iterator[Any]:
    rigs: list[Rig] = []

    def build(
        log: Log, sub: Subscription | None = None, store: Store | None = None, **more: Any
    ) -> Rig:
        pool, owner, store = Pool(), Owner(), store or Store()
        lane = ReplayLane(
            replay(**more),
            sub or subscription(),
            0,
            owner,
            "setu.p.t",
            log,
            store,
            pool,  # type: ignore[arg-type]
            clock=lambda: NOW + 60_000,  # the window's end is long past
        )
        pool.lane = lane
        rig = Rig(log, store, owner, pool, lane)
        rigs.append(rig)
        return rig

    yield build
    for rig in rigs:
        rig.lane.stop()


async def test_each_group_is_called_one_message_at_a_time_in_log_order(make: Any) -> None:
    log = Log()
    a0, b1, a2, b3, loose = log.add("a"), log.add("b"), log.add("a"), log.add("b"), log.add(None)
    rig = make(log)
    rig.start()
    await rig.until("a's and b's first called", lambda: sorted(rig.pool.ids()) == [a0, b1, loose])
    rig.pool.answer(a0)
    await rig.until("a's second called", lambda: a2 in rig.pool.ids())
    assert b3 not in rig.pool.ids()  # b's first is still out
    for message_id in (b1, a2, loose):
        rig.pool.answer(message_id)
    await rig.until("b's second called", lambda: rig.pool.ids() == [b3])
    rig.pool.answer(b3)
    progress = await rig.settled()
    assert progress.done and (progress.matched, progress.delivered) == (5, 5)
    assert progress.next_offset == 5 and rig.store.finished == 1


async def test_the_window_the_ids_and_both_filters_select(make: Any) -> None:
    log = Log()
    log.add("a", produced_at_ms=NOW - 5000)  # before the window
    inside = log.add("a", headers=(("X_REGION", "eu"),))
    log.add("a", headers=(("X_REGION", "us"),))  # the replay's filter turns it away
    log.add("b", headers=(("X_REGION", "eu"),))  # the subscription's filter does
    log.add("a", produced_at_ms=NOW + 5000, headers=(("X_REGION", "eu"),))  # after it
    sub = subscription(
        policies=Policies(filter=parse_filter({"not": {"header": "X_GROUP_ID", "equals": "b"}}))
    )
    rig = make(log, sub, filter=parse_filter({"header": "X_REGION", "equals": "eu"}))
    rig.start()
    await rig.until("the one selected called", lambda: rig.pool.ids() == [inside])
    rig.pool.answer(inside)
    progress = await rig.settled()
    assert (progress.scanned, progress.matched, progress.delivered) == (4, 1, 1)


async def test_a_message_the_ingest_job_wrote_twice_is_replayed_once(make: Any) -> None:
    log = Log()
    first = log.add("a", ingest_offset=7)
    log.add("a", ingest_offset=7)  # the same record again, after an ingest job's replay
    rig = make(log)
    rig.start()
    await rig.until("called", lambda: rig.pool.ids() == [first])
    rig.pool.answer(first)
    progress = await rig.settled()
    assert progress.delivered == 1


async def test_a_failing_group_is_set_aside_and_replayed_once_it_is_healthy(make: Any) -> None:
    log = Log()
    a0, b1, a2 = log.add("a"), log.add("b"), log.add("a")
    rig = make(log)
    rig.owner.blocked.add("a")  # a's live delivery is parked
    rig.start()
    await rig.until("b called", lambda: rig.pool.ids() == [b1])
    rig.pool.answer(b1)
    await rig.until(
        "a set aside",
        lambda: (
            rig.store.saved.get(0, None) is not None and rig.store.saved[0].deferred == {"a": 0}
        ),
    )
    assert rig.pool.ids() == [] and not rig.lane.finished
    # When a is healthy again, a later pass replays it from its first message, in order
    rig.owner.blocked.clear()
    await rig.until("a's first called", lambda: rig.pool.ids() == [a0])
    rig.pool.answer(a0)
    await rig.until("a's second called", lambda: rig.pool.ids() == [a2])
    rig.pool.answer(a2)
    progress = await rig.settled()
    assert progress.done and progress.deferred == {}
    assert (progress.matched, progress.delivered) == (3, 3)  # counted once, over two passes


async def test_under_park_a_group_whose_replayed_message_failed_goes_no_further(
    make: Any,
) -> None:
    log = Log()
    a0, b1, a2 = log.add("a"), log.add("b"), log.add("a")
    rig = make(log, subscription(dead_letter_policy=DeadLetterPolicy.PARK))
    rig.start()
    await rig.until("firsts called", lambda: sorted(rig.pool.ids()) == [a0, b1])
    rig.pool.answer(a0, REJECTED)
    rig.pool.answer(b1)
    progress = await rig.settled()
    assert a2 not in rig.pool.ids()
    assert (progress.delivered, progress.failed, progress.skipped) == (1, 1, 1)
    assert progress.failed_messages == [a0] and progress.failed_groups == ["a"]


async def test_under_skip_the_group_goes_on_after_a_failed_replayed_message(make: Any) -> None:
    log = Log()
    a0, a1 = log.add("a"), log.add("a")
    rig = make(log, subscription(dead_letter_policy=DeadLetterPolicy.SKIP))
    rig.start()
    await rig.until("first called", lambda: rig.pool.ids() == [a0])
    rig.pool.answer(a0, REJECTED)
    await rig.until("second called", lambda: rig.pool.ids() == [a1])
    rig.pool.answer(a1)
    progress = await rig.settled()
    assert (progress.delivered, progress.failed, progress.failed_groups) == (1, 1, [])


async def test_a_retried_call_waits_its_delay_and_the_budget_ends_it(make: Any) -> None:
    log = Log()
    a0 = log.add("a")
    rig = make(log, subscription(retry=RetryPolicy(delays_ms=(100, 200))))
    rig.start()
    await rig.until("called", lambda: rig.pool.ids() == [a0])
    numbers = []
    for _ in range(3):  # N+1 attempts with two tiers
        await rig.until("called again", lambda: rig.pool.ids() == [a0])
        attempt = rig.pool.answer(a0, RETRY)
        numbers.append((attempt.number, attempt.not_before_ms > 0, attempt.replay))
    assert numbers == [(1, False, "rp_1"), (2, True, "rp_1"), (3, True, "rp_1")]
    progress = await rig.settled()
    assert (progress.delivered, progress.failed) == (0, 1)


async def test_a_new_owner_goes_on_from_the_stored_progress(make: Any) -> None:
    log = Log()
    ids = [log.add("a") for _ in range(4)]
    rig = make(log)
    rig.start()
    await rig.until("first called", lambda: rig.pool.ids() == [ids[0]])
    rig.pool.answer(ids[0])
    await rig.until("second called", lambda: rig.pool.ids() == [ids[1]])
    rig.lane.stop()  # the partition moved away with ids[1] on its way
    await rig.settled()
    # A new owner reads the stored progress: from the unfinished one on, counted once
    second = make(log, store=rig.store)
    second.start()
    await second.until("second called again", lambda: second.pool.ids() == [ids[1]])
    for message_id in ids[1:]:
        await second.until("called", lambda m=message_id: second.pool.ids() == [m])
        second.pool.answer(message_id)
    progress = await second.settled()
    assert progress.done and (progress.scanned, progress.matched, progress.delivered) == (4, 4, 4)


async def test_a_cancelled_replay_ends_its_lane(make: Any) -> None:
    log = Log()
    ids = [log.add("a") for _ in range(3)]
    rig = make(log)
    rig.start()
    await rig.until("first called", lambda: rig.pool.ids() == [ids[0]])
    rig.store.running = False  # cancelled: the next save says so
    assert rig.task is not None
    await asyncio.wait_for(rig.task, 5)
    assert rig.lane.finished and not rig.lane.alive


async def test_calls_are_paced_to_the_replays_share_of_its_rate(make: Any) -> None:
    log = Log()
    for n in range(20):
        log.add(f"g{n}")
    rig = make(log, rate_per_second=4.0, partitions=2)  # 2 a second on this partition
    rig.start()
    await rig.until("all handed over", lambda: len(rig.pool.waiting) == 20)
    dues = sorted(a.not_before_ms for a in rig.pool.waiting if a.not_before_ms)
    # the bucket's burst goes at once; the rest half a second apart
    assert dues and dues[-1] - dues[0] >= 0.5 * 1000 * (len(dues) - 2)


async def test_a_message_live_delivery_has_not_finished_is_not_replayed_yet(make: Any) -> None:
    log = Log()
    a0, a1, b2 = log.add("a"), log.add("a"), log.add("b")
    rig = make(log)
    rig.owner.frontier = 1  # a1 and b2 are still on their first, live, delivery
    rig.start()
    await rig.until("a0 called", lambda: rig.pool.ids() == [a0])
    rig.pool.answer(a0)
    reads = rig.log.reads
    await rig.until("the lane looked again twice", lambda: rig.log.reads >= reads + 2)
    assert rig.pool.ids() == [] and not rig.lane.finished
    rig.owner.frontier = 3  # live delivery got through them
    await rig.until("the rest called", lambda: sorted(rig.pool.ids()) == [a1, b2])
    rig.pool.answer(a1)
    rig.pool.answer(b2)
    progress = await rig.settled()
    assert progress.delivered == 3
