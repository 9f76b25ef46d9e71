"""The live reader of the shared readers (delivery/readers.py): the membership consumer, on its
own thread, hands every record of a main partition it is assigned to the cursors there, from
the first one on."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from delivery.readers import ReaderHub, ReaderThread
from tests.unit.delivery.main_log import MAIN, Record


class GroupConsumer:
    """The membership consumer as librdkafka runs it: subscribed, it is assigned main
    partition 0 by a rebalance served inside a poll, and that same poll goes on to return the
    partition's first record when it is fetched before the poll's timeout (a takeover quick
    enough to end within it)."""

    def __init__(self, config: dict[str, Any], **_: Any) -> None:
        self.log = [Record(o) for o in range(3)]
        self.assigned: list[TopicPartition] = []
        self.on_assign: Callable[[Any, list[TopicPartition]], None] | None = None

    def subscribe(self, topics: list[str], on_assign: Any, **_: Any) -> None:
        self.on_assign = on_assign

    def assignment(self) -> list[TopicPartition]:
        return list(self.assigned)

    def incremental_assign(self, partitions: list[TopicPartition]) -> None:
        self.assigned += partitions

    def _next(self) -> Record | None:
        if not self.assigned:
            return None
        start = self.assigned[0].offset
        fetched = [r for r in self.log if r.offset() >= start]
        if not fetched:
            return None
        record = fetched[0]
        self.assigned[0] = TopicPartition(MAIN, 0, record.offset() + 1)
        return record

    def poll(self, timeout: float) -> Record | None:
        if not self.assigned and self.on_assign is not None:
            self.on_assign(self, [TopicPartition(MAIN, 0)])
            return self._next()
        record = self._next()
        if record is None:
            time.sleep(timeout)
        return record

    def consume(self, num_messages: int, timeout: float) -> list[Record]:
        taken: list[Record] = []
        while len(taken) < num_messages and (record := self._next()) is not None:
            taken.append(record)
        return taken

    def close(self) -> None:
        pass


class View:
    """A subscription whose takeover of partition 0 is quick: its cursor starts at 0."""

    main_topic = MAIN
    key = "s#1"
    group = "setu.sub.p.s"

    def __init__(self) -> None:
        self.taken: list[int] = []

    async def take_over(self, partitions: list[int], queued_s: float) -> dict[int, int]:
        return {p: 0 for p in partitions}

    def has_room(self, partition: int) -> bool:
        return True

    def deliver(self, messages: list[Any]) -> None:
        self.taken += [m.offset() for m in messages]


class Idle:
    def post(self, command: Callable[[Any], Any], then: Callable[[], None] | None = None) -> None:
        pass


def membership_of(hub: ReaderHub, view: View) -> ReaderThread:
    """``hub`` serving one subscription (``view``), with its membership reader (not started)
    and idle catch-up and tier readers."""
    hub.catch_up = hub.tiers = Idle()  # type: ignore[assignment]
    hub._views[MAIN].add(view)  # type: ignore[arg-type]
    hub._by_key[view.key] = view  # type: ignore[assignment]
    hub.membership = ReaderThread(
        "membership",
        {"group.id": "setu.delivery"},
        asyncio.get_running_loop(),
        hub._on_live,
        assigned=hub._main_assigned,
        revoked=hub._main_revoked,
        lost=hub._main_lost,
    )
    return hub.membership


async def read_three(membership: ReaderThread, view: View) -> None:
    """Starts ``membership`` and closes it once ``view`` took the log's three records (or 3 s
    passed)."""
    membership.start([MAIN])
    try:
        for _ in range(300):
            if len(view.taken) >= 3:
                break
            await asyncio.sleep(0.01)
    finally:
        await membership.close()


def test_the_first_record_fetched_in_the_poll_that_assigned_its_partition_is_taken(
    monkeypatch: Any,
) -> None:
    monkeypatch.setattr("delivery.kafka_io.Consumer", GroupConsumer)

    async def scenario() -> None:
        # Given a worker with one subscription of topic t, whose membership consumer has no
        # partition yet
        view = View()
        membership = membership_of(
            ReaderHub(lambda group: {}, lambda t, p: 0, "setu.delivery"), view
        )
        # When a rebalance inside a poll assigns it main partition 0, the subscription's
        # takeover is done at once, and that poll returns the partition's first record
        await read_three(membership, view)
        # Then the subscription took every record, that one included
        assert view.taken == [0, 1, 2]

    asyncio.run(scenario())


class FromTheStart(View):
    """A subscription with nothing committed: its cursor starts at the partition's first
    offset, which its takeover asks Kafka for."""

    def __init__(self) -> None:
        super().__init__()
        self.failures: list[BaseException] = []

    async def take_over(self, partitions: list[int], queued_s: float) -> dict[int, int]:
        return {p: -1 for p in partitions}

    def fail(self, error: BaseException) -> None:
        self.failures.append(error)


def test_a_takeover_rides_out_kafka_being_away_while_it_asks_where_to_start(
    monkeypatch: Any,
) -> None:
    monkeypatch.setattr("delivery.kafka_io.Consumer", GroupConsumer)
    monkeypatch.setattr("delivery.readers.OFFSET_RETRY_S", (0.01, 0.02))
    asks: list[int] = []

    def first_offset(topic: str, partition: int) -> int:
        # Kafka away for the first two asks (its only broker restarting), then back
        asks.append(partition)
        if len(asks) <= 2:
            raise KafkaException(KafkaError(KafkaError._ALL_BROKERS_DOWN))
        return 0

    async def scenario() -> None:
        # Given a subscription with nothing committed, and Kafka away when it is taken over
        view = FromTheStart()
        membership = membership_of(ReaderHub(lambda group: {}, first_offset, "setu.delivery"), view)
        # When its partition is assigned
        await read_three(membership, view)
        # Then once Kafka answers it reads from the first record, and nothing failed
        assert view.taken == [0, 1, 2]
        assert view.failures == [] and membership.done.exception() is None
        assert len(asks) == 3

    asyncio.run(scenario())
