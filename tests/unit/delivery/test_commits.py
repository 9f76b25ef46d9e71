"""What a subscription commits (delivery/commits.py): flush first, only what moved, the main
log's commit with its ingest marks, and outcomes below a commit forgotten; and its releases
polled from the worker's reading of Redis (delivery/watch.py)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine, Mapping
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from delivery.commits import Commits
from delivery.pace import CommitPace
from delivery.watch import StateWatch, Watched
from setu.ordering.tiers import DLQ, MAIN
from state.groups import ReleaseRequests, StateLost
from tests.consumers import ConsumerStub

TOPICS = {MAIN: "main", 1: "rq.1", DLQ: "dlq"}
TIERS = {topic: tier for tier, topic in TOPICS.items()}


class Kafka:
    def __init__(self) -> None:
        self.commits: list[list[TopicPartition]] = []

    def commit(self, offsets: list[TopicPartition], asynchronous: bool) -> None:
        self.commits.append(offsets)


class Engine:
    def __init__(self, committable: dict[int, int]) -> None:
        self.safe = committable

    def committable(self) -> dict[int, int]:
        return dict(self.safe)

    def ingest_marks(self, main_offset: int) -> dict[int, int]:
        return {0: main_offset * 10}


class Port:
    def __init__(self, partition: int, engine: Engine) -> None:
        self.partition, self.engine, self.alive = partition, engine, True


class Writer:
    idle = False  # something handed in: a commit flushes first

    def __init__(self, order: list[str]) -> None:
        self.order = order

    async def flush(self) -> None:
        self.order.append("flush")


class Store:
    def __init__(self) -> None:
        self.trimmed: list[tuple[int, dict[int, int]]] = []
        self.polled: list[int] = []
        self.releases = ReleaseRequests(set(), set())

    async def poll_releases(self, partition: int) -> ReleaseRequests:
        self.polled.append(partition)
        return self.releases

    async def trim(self, partition: int, committed: Mapping[int, int]) -> None:
        self.trimmed.append((partition, dict(committed)))


def commits(
    engine: Engine,
    kafka: Kafka,
    order: list[str],
    store: Store,
    watch: StateWatch | None = None,
    pace: CommitPace | None = None,
) -> tuple[Commits, list[Coroutine[Any, Any, None]]]:
    background: list[Coroutine[Any, Any, None]] = []
    made = Commits(
        ConsumerStub(kafka),  # type: ignore[arg-type]
        TOPICS,
        TIERS,
        {0: Port(0, engine)},  # type: ignore[dict-item]
        Writer(order),  # type: ignore[arg-type]
        store,  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        background.append,
        watch,
        pace=pace,
    )
    return made, background


async def test_it_flushes_first_then_commits_only_what_moved_with_the_main_logs_marks() -> None:
    kafka, order, store = Kafka(), [], Store()
    engine = Engine({MAIN: 5, 1: 2})
    made, background = commits(engine, kafka, order, store)
    # When it commits twice, the engine's safe offsets moving only in the main log between
    await made.commit()
    engine.safe[MAIN] = 8
    await made.commit()
    # Then it flushed before each commit, and the second commit holds only the main log
    assert order == ["flush", "flush"]
    first, second = kafka.commits
    assert {(tp.topic, tp.offset) for tp in first} == {("main", 5), ("rq.1", 2)}
    assert [(tp.topic, tp.offset, tp.metadata) for tp in second] == [("main", 8, "0:80")]
    # And the outcomes below each commit are forgotten, in the background
    await asyncio.gather(*background)
    assert store.trimmed == [(0, {MAIN: 5, 1: 2}), (0, {MAIN: 8})]


async def test_a_periodic_commit_waits_for_its_turn_of_the_workers_pace() -> None:
    # Given a worker whose pace has no turn left for a while (another runner took it)
    pace = CommitPace(per_s=20, burst=1)
    await pace.turn()
    kafka, order, store = Kafka(), [], Store()
    engine = Engine({MAIN: 5})
    made, background = commits(engine, kafka, order, store, pace=pace)
    # When the commit's tick comes with an offset to commit
    tick = made.commit_tick()
    assert tick is not None
    ticking = asyncio.create_task(tick)
    # Then it waits for its turn, committing nothing meanwhile
    for _ in range(5):
        await asyncio.sleep(0)
    assert kafka.commits == []
    assert pace.waiting == 1
    # And once its turn came, it committed what is safe by then
    engine.safe[MAIN] = 7
    await asyncio.wait_for(ticking, timeout=5)
    assert [[tp.offset for tp in batch] for batch in kafka.commits] == [[7]]
    await asyncio.gather(*background)


async def test_a_tick_with_nothing_to_commit_writes_outcomes_without_waiting_for_a_turn() -> None:
    pace = CommitPace(per_s=1, burst=1)
    await pace.turn()
    kafka, order, store = Kafka(), [], Store()
    made, _ = commits(Engine({}), kafka, order, store, pace=pace)
    tick = made.commit_tick()
    assert tick is not None
    await asyncio.wait_for(tick, timeout=0.5)
    assert order == ["flush"]
    assert pace.waiting == 0


async def test_a_partition_taken_over_again_commits_even_an_unchanged_offset() -> None:
    kafka, order, store = Kafka(), [], Store()
    made, background = commits(Engine({MAIN: 5}), kafka, order, store)
    await made.commit()
    made.assigned(MAIN, 0)
    await made.commit()
    await asyncio.gather(*background)
    assert [[tp.offset for tp in batch] for batch in kafka.commits] == [[5], [5]]


class Released(Engine):
    def __init__(self) -> None:
        super().__init__({})
        self.groups: list[set[str]] = []

    def release_groups(self, groups: set[str]) -> None:
        self.groups.append(groups)

    def add_pending_releases(self, offsets: set[int]) -> None:
        pass


async def test_releases_are_polled_when_the_watch_saw_them_move_and_not_while_it_saw_nothing() -> (
    None
):
    # Given a runner's commits handing its reading of Redis to the worker's watch
    engine, store = Released(), Store()
    made, _ = commits(engine, Kafka(), [], store, StateWatch(None))  # type: ignore[arg-type]
    made.start_watching("p", "s", store)
    entry = made._watched
    assert isinstance(entry, Watched)
    # When nothing was read yet, every tick asks Redis itself
    await made.poll_releases()
    await made.poll_releases()
    assert store.polled == [0, 0]
    # And once the watch read the release version, a tick asks only when it moved
    entry.version, entry.read_at = 3, time.monotonic()
    await made.poll_releases()
    await made.poll_releases()
    assert store.polled == [0, 0, 0]
    store.releases = ReleaseRequests({"G"}, set())
    entry.version = 4  # an operator unsidelined G
    await made.poll_releases()
    assert store.polled == [0, 0, 0, 0]
    assert engine.groups[-1] == {"G"}
    # And a reading gone stale (Redis away, the watch stopped) has every tick ask again
    entry.read_at -= 60
    await made.poll_releases()
    assert store.polled == [0, 0, 0, 0, 0]


class Owner:
    """A durable store's owner figures (state/durable_groups.py's rule)."""

    def written(self) -> dict[int, tuple[int, int]]:
        return {0: (2, 5)}

    def check_held(self, partition: int, epoch: int, made: int, held: tuple[int, int]) -> None:
        if held < (epoch, made):
            raise StateLost([partition], "lost")


def test_a_reading_that_found_writes_missing_raises_state_lost_at_the_runners_tick() -> None:
    entry = Watched("p", "s", Owner(), checks=[(0, 2, 5, (2, 5))], read_at=time.monotonic())
    entry.verify()  # Redis holds all five writes of epoch 2
    entry.checks = [(0, 2, 5, (0, -1))]  # Redis came back empty
    with pytest.raises(StateLost):
        entry.verify()


class KafkaAway(Kafka):
    """Commits fail with ``error`` until ``back``."""

    def __init__(self, error: BaseException) -> None:
        super().__init__()
        self.error: BaseException | None = error

    def commit(self, offsets: list[TopicPartition], asynchronous: bool) -> None:
        if self.error is not None:
            raise self.error
        super().commit(offsets, asynchronous)


@pytest.mark.parametrize(
    "error",
    [
        KafkaException(KafkaError(KafkaError._TRANSPORT)),
        KafkaException(KafkaError(KafkaError.COORDINATOR_NOT_AVAILABLE)),
        # A tier made a moment ago that the group's coordinator does not know yet (seen when
        # a thousand subscriptions made their tiers at once, and failed their runners)
        KafkaException(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART)),
        KafkaException(KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION)),
        TimeoutError(),
    ],
)
async def test_a_commit_kafka_cannot_take_now_is_made_at_the_next_tick(
    error: BaseException, caplog: pytest.LogCaptureFixture
) -> None:
    # Given Kafka away when the runner commits
    kafka, order, store = KafkaAway(error), [], Store()
    made, background = commits(Engine({MAIN: 5}), kafka, order, store)
    # When it commits: the runner goes on (nothing raised), and the failure is logged
    await made.commit()
    assert "tried again at the next tick" in caplog.text
    # Then once Kafka is back the next tick commits the same offset, and only then are the
    # outcomes below it forgotten
    kafka.error = None
    await made.commit()
    await asyncio.gather(*background)
    assert [[tp.offset for tp in batch] for batch in kafka.commits] == [[5]]
    assert store.trimmed == [(0, {MAIN: 5})]


async def test_a_commit_refused_for_good_still_fails_the_runner() -> None:
    # A commit refused because the partitions are no longer this runner's is not retried
    error = KafkaException(KafkaError(KafkaError.ILLEGAL_GENERATION))
    made, _ = commits(Engine({MAIN: 5}), KafkaAway(error), [], Store())
    with pytest.raises(KafkaException):
        await made.commit()
