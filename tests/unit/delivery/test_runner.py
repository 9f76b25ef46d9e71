"""The runner's seeks and holds on a consumer that refuses some seeks (as librdkafka does with
an erroneous state while a partition's fetcher is still starting)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any

import pytest
import redis
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from delivery.effects import PartitionEffects
from delivery.guards import SLOT_RENEW_MS
from delivery.http import HttpClient
from delivery.parts import RunnerConfig, RunnerParts
from delivery.runner import SubscriptionRunner
from delivery.webhook import WebhookSender
from setu.clock import now_ms
from setu.ordering.tiers import DLQ
from state.groups_stub import StubGroupStore
from state.kafka_reader import KafkaReader
from state.workers import StubWorkers
from tests.consumers import ConsumerStub
from tests.runners import EngineStub, NoCopies
from tests.unit.delivery.sim import subscription


class Consumer:
    """Refuses the first ``refusals`` seeks; records every seek and pause."""

    def __init__(self, refusals: int) -> None:
        self.refusals = refusals
        self.seeks: list[int] = []
        self.calls: list[str] = []

    def seek(self, tp: TopicPartition) -> None:
        self.calls.append(f"seek {tp.offset}")
        if self.refusals:
            self.refusals -= 1
            raise KafkaException(KafkaError(KafkaError._STATE))
        self.seeks.append(tp.offset)

    def pause(self, partitions: list[TopicPartition]) -> None:
        self.calls.append("pause")

    def resume(self, partitions: list[TopicPartition]) -> None:
        self.calls.append("resume")


async def turns(n: int = 20) -> None:
    """Lets the loop run ``n`` times (each retry takes two: the seek, then its settling)."""
    for _ in range(n):
        await asyncio.sleep(0)


def runner_on(
    consumer: Consumer, queue: bool = False
) -> tuple[SubscriptionRunner, PartitionEffects, EngineStub]:
    """A runner with one port for partition 0, on stubs. Its consumer's commands run at once,
    or, given ``queue``, wait as on the consumer thread until the stub runs them."""
    sub = subscription()
    stub = ConsumerStub(consumer, queue=queue)
    parts = RunnerParts(
        store=StubGroupStore(),
        sender=WebhookSender(sub, HttpClient(allow_private=True)),
        reader=KafkaReader("127.0.0.1:1"),
        copies=NoCopies(),
        reports=StubWorkers(),
        consumer=stub.factory,
    )
    config = RunnerConfig(bootstrap="127.0.0.1:1", worker_id="w", seek_retry_s=0.0)
    runner = SubscriptionRunner(sub, config, parts)
    port = PartitionEffects(runner.context, 0)
    engine = EngineStub()
    port.engine = engine  # type: ignore[assignment]
    runner.ports[0] = port
    return runner, port, engine


async def test_a_refused_seek_is_tried_again_before_the_engine_reads_on() -> None:
    # Given a consumer that refuses the first two seeks
    consumer = Consumer(refusals=2)
    runner, port, engine = runner_on(consumer)
    # When the engine asks to read the DLQ again from offset 5
    runner.flow.seek(port, DLQ, 5)
    await asyncio.wait_for(engine.done.wait(), 5)
    # Then the seek was made until it took, and only then was the engine told
    assert consumer.calls == ["seek 5", "seek 5", "seek 5"]
    assert consumer.seeks == [5]
    assert engine.unblocked_at == [(DLQ, 5)]


async def test_a_hold_ends_only_once_its_seek_took() -> None:
    # Given a consumer that refuses the first seek
    consumer = Consumer(refusals=1)
    runner, port, engine = runner_on(consumer)
    # When a retry tier holds at offset 3 until a time already past
    runner.flow.hold(port, 1, 3, now_ms())
    await asyncio.wait_for(engine.done.wait(), 5)
    # Then it paused, sought until the seek took, and resumed before reading on
    assert consumer.calls == ["pause", "seek 3", "seek 3", "resume"]
    assert engine.unblocked_at == [(1, 3)]


async def test_a_given_up_partition_stops_seeking() -> None:
    consumer = Consumer(refusals=100)
    runner, port, engine = runner_on(consumer)
    # Given a seek refused while the partition is being given up
    runner.flow.seek(port, DLQ, 5)
    port.alive = False
    await turns()
    # Then it is not tried again
    assert consumer.calls == ["seek 5"]
    assert engine.unblocked_at == []


async def test_a_pause_and_seek_of_a_given_up_partition_do_not_reach_its_next_assignment() -> None:
    consumer = Consumer(refusals=0)
    runner, port, engine = runner_on(consumer, queue=True)
    # Given a hold asked for while the partition was being given up, its pause and seek
    # still waiting for the consumer thread (which runs commands between polls, and the
    # rebalance happens inside a poll)
    runner.flow.hold(port, 1, 3, now_ms())
    # When the partition is given up and assigned to this worker again before they run
    port.alive = False
    runner.ports[0] = PartitionEffects(runner.context, 0)
    stub = runner._consumer
    assert isinstance(stub, ConsumerStub)
    stub.run_queued()
    await turns()
    # Then neither reaches the consumer: the new assignment would stay paused for good, or
    # skip the records before offset 3
    assert consumer.calls == []
    assert engine.unblocked_at == []


async def test_stopping_ends_housekeeping_that_swallowed_its_cancellation() -> None:
    # Given a housekeeping loop whose step swallows the cancellation meant to end it (as a
    # library call may) and then goes back to a long sleep
    from delivery.ticker import cancel_all

    swallowed = asyncio.Event()

    async def housekeeping() -> None:
        while True:
            try:
                await asyncio.sleep(300)
            except asyncio.CancelledError:
                if swallowed.is_set():
                    raise
                swallowed.set()

    tasks = [asyncio.get_running_loop().create_task(housekeeping())]
    await asyncio.sleep(0.05)
    # When the runner stops its background tasks
    await asyncio.wait_for(cancel_all(tasks, every_s=0.05), 5)
    # Then they end anyway, soon, though one ignored the first cancellation
    assert swallowed.is_set() and tasks[0].done()


class NoDroppedTiers:
    def existing(self, topics: list[str]) -> set[str]:
        return set()


def budgeted_runner(budget: object) -> tuple[SubscriptionRunner, ConsumerStub]:
    """A runner with no partition yet that shares ``max_in_flight`` through ``budget``."""
    sub = subscription()
    stub = ConsumerStub(Consumer(0))
    parts = RunnerParts(
        store=StubGroupStore(),
        sender=WebhookSender(sub, HttpClient(allow_private=True)),
        reader=NoDroppedTiers(),  # type: ignore[arg-type]
        copies=NoCopies(),
        reports=StubWorkers(),
        consumer=stub.factory,
        budget=budget,  # type: ignore[arg-type]
    )
    return SubscriptionRunner(
        sub, RunnerConfig(bootstrap="127.0.0.1:1", worker_id="w"), parts
    ), stub


async def test_redis_away_at_the_start_neither_ends_the_runner_nor_leaves_its_consumer() -> None:
    # Given a runner whose shared budget cannot be reached (Redis failing over)
    class AwayBudget:
        async def share(
            self, worker: str, demand: int, busy: int, limit: int, ttl_ms: int = 3000
        ) -> int:
            raise redis.ConnectionError("no master found")

        async def leave(self, worker: str) -> None:
            raise redis.ConnectionError("no master found")

    runner, stub = budgeted_runner(AwayBudget())
    # When it starts, then is stopped
    running = asyncio.get_running_loop().create_task(runner.run())
    await turns()
    assert not running.done(), "the runner gave up at its start"
    runner.stop()
    await asyncio.wait_for(running, 10)
    # Then it ran until stopped, and its consumer left the group
    assert stub.done.done()


class DeliveredEngine(EngineStub):
    """An engine that delivered rq.1 records up to offset 42 of its partition."""

    def committable(self) -> dict[int, int]:
        return {1: 42}


async def test_a_revocation_whose_state_changes_were_not_written_commits_nothing() -> None:
    # Given a partition whose engine delivered rq.1 records up to offset 42, and a state store
    # that went away before their groups' state changes were written (Redis flushed or down)
    runner, port, _ = runner_on(Consumer(refusals=0))
    port.engine = DeliveredEngine()  # type: ignore[assignment]

    async def gone() -> None:
        raise ConnectionError("Error 111 connecting to Redis")

    runner.writer.flush = gone  # type: ignore[method-assign]
    # When the partition is revoked (the worker stopping on that error, or a rebalance)
    offsets = await runner.revoked([TopicPartition("t", 0)])
    # Then nothing is committed: the next owner reads those records again, with the group
    # state the changelog holds, instead of starting past records that state still counts
    assert offsets == []
    # And with the state changes written, the same revocation commits what was delivered
    runner, port, _ = runner_on(Consumer(refusals=0))
    port.engine = DeliveredEngine()  # type: ignore[assignment]
    offsets = await runner.revoked([TopicPartition("t", 0)])
    assert [(tp.topic, tp.partition, tp.offset) for tp in offsets] == [(runner.topics[1], 0, 42)]


async def test_an_idle_runner_renews_its_share_when_records_arrive_not_four_times_a_second(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("delivery.ticker.REST_S", 60.0)

    class Budget:
        async def share(
            self, worker: str, demand: int, busy: int, limit: int, ttl_ms: int = 3000
        ) -> int:
            return demand

        async def leave(self, worker: str) -> None:
            pass

    runner, _ = budgeted_runner(Budget())
    ticks: list[float] = []
    renew = runner.guards.renew_tick

    def counted(dispatcher: Any, busy: int) -> Any:
        ticks.append(time.monotonic())
        return renew(dispatcher, busy)

    monkeypatch.setattr(runner.guards, "renew_tick", counted)
    # Given an idle runner (no records, no calls): its share is renewed once at the start
    running = asyncio.get_running_loop().create_task(runner.run())
    await turns()
    started = len(ticks)
    # When more than two renewal intervals pass, no tick comes
    await asyncio.sleep(3 * SLOT_RENEW_MS / 1000)
    assert len(ticks) == started
    # Then records arriving wake it at once (and prove it was waiting, not gone)
    runner.on_batch([])
    for _ in range(100):
        if len(ticks) > started:
            break
        await asyncio.sleep(0.01)
    assert len(ticks) == started + 1
    runner.stop()
    await asyncio.wait_for(running, 10)


class AwayWorkers(StubWorkers):
    """Reports that fail while ``away`` (Redis unreachable, or its pool busy past its wait)."""

    def __init__(self) -> None:
        super().__init__()
        self.away = True
        self.failed = 0

    async def report(
        self, project: str, subscription: str, worker_id: str, figures: Mapping[str, Any]
    ) -> None:
        if self.away:
            self.failed += 1
            raise redis.ConnectionError("No connection available.")
        await super().report(project, subscription, worker_id, figures)


def reporting_runner(workers: StubWorkers) -> SubscriptionRunner:
    sub = subscription()
    parts = RunnerParts(
        store=StubGroupStore(),
        sender=WebhookSender(sub, HttpClient(allow_private=True)),
        reader=NoDroppedTiers(),  # type: ignore[arg-type]
        copies=NoCopies(),
        reports=workers,
        consumer=ConsumerStub(Consumer(0)).factory,
    )
    config = RunnerConfig(bootstrap="127.0.0.1:1", worker_id="w", stats_interval_ms=10)
    return SubscriptionRunner(sub, config, parts)


async def until(condition: Any, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


async def test_a_report_redis_cannot_take_for_a_while_is_sent_again_and_the_runner_goes_on() -> (
    None
):
    # Given a runner whose reports Redis cannot take (a failover, or a pool busy under load)
    workers = AwayWorkers()
    runner = reporting_runner(workers)
    running = asyncio.get_running_loop().create_task(runner.run())
    # When several rounds fail
    await until(lambda: workers.failed >= 5)
    # Then the runner goes on, and once Redis takes them its report is there
    assert not running.done(), "the runner gave up on a report"
    workers.away = False
    await until(lambda: bool(workers.reports))
    assert not running.done()
    runner.stop()
    await asyncio.wait_for(running, 10)


async def test_a_report_redis_cannot_take_past_the_patience_ends_the_runner(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a runner whose reports Redis never takes, and a patience of 0.2 s
    monkeypatch.setattr("delivery.ticker.PATIENCE_S", 0.2)
    workers = AwayWorkers()
    runner = reporting_runner(workers)
    # When it runs, then it gives up with Redis's error once the patience ran out (the
    # worker starts it anew)
    with pytest.raises(redis.ConnectionError):
        await asyncio.wait_for(runner.run(), 10)
