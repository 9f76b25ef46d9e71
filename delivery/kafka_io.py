"""Kafka at the edge of delivery: a consumer on its own thread, an awaitable producer, and the
short reads a takeover needs (tails of retry tiers, offsets for a time).

:class:`ConsumerThread` owns one ``confluent_kafka.Consumer``; nothing else touches it. The
event loop sends it commands (pause, seek, commit, ...) that run between two polls, and it
hands batches back with ``call_soon_threadsafe``. A command may carry a callback that is posted
the same way right after it ran, so the loop sees "the seek happened" exactly between the
batches fetched before it and those fetched after. Rebalance callbacks run on this thread and
wait for the loop to prepare (assignment) or drain (revocation) the partitions.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from confluent_kafka import (
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)

from setu.envelope import KafkaHeaders
from setu.limits import MessageLimits
from setu.producer_settings import durable_producer
from state.kafka_reader import POLL_BATCH

log = logging.getLogger(__name__)

T = TypeVar("T")

POLL_TIMEOUT_S = 0.05
# Batches handed to the loop and not yet processed; the thread waits beyond this, so a loop
# that falls behind slows the consumer instead of piling batches up in memory.
MAX_OUTSTANDING_BATCHES = 2


def take(consumer: Consumer, timeout_s: float = POLL_TIMEOUT_S) -> list[Message]:
    """What the consumer holds now, up to ``POLL_BATCH``, waiting at most ``timeout_s`` for
    the first. A lone message is handed on as soon as it arrives: ``consume()`` alone
    waits out its whole timeout unless a full batch is there (measured: p50 28 ms of every
    message's wait in the main log at 200 msg/s, docs/latency.md)."""
    first = consumer.poll(timeout_s)
    if first is None:
        return []
    return [first, *consumer.consume(POLL_BATCH - 1, 0)]


class RebalanceListener(Protocol):
    """What the consumer thread asks of its owner, on the event loop."""

    def on_batch(self, messages: list[Message]) -> None: ...

    async def assigned(self, committed: list[TopicPartition]) -> Assignment: ...

    async def revoked(self, partitions: list[TopicPartition]) -> list[TopicPartition]: ...

    def committed(self, offsets: list[TopicPartition]) -> None: ...

    def lost(self, partitions: list[TopicPartition]) -> None: ...


@dataclass(slots=True)
class Assignment:
    """Where to start each assigned partition (offset < 0: from the committed offset), which
    of them start paused, and offsets to commit at once (an operator's seek) followed by
    ``after_commit`` on the loop."""

    starts: list[TopicPartition]
    commit_now: list[TopicPartition]
    after_commit: Callable[[], Awaitable[None]] | None = None
    paused: list[TopicPartition] = field(default_factory=list)
    # Tier partitions with nothing to read from their start: a shared reader need not fetch
    # them until something is written there or sought (delivery/views.py); a consumer of the
    # subscription's own reads them as any other.
    idle: list[TopicPartition] = field(default_factory=list)


def consumer_config(
    bootstrap: str,
    group: str,
    client_id: str,
    limits: MessageLimits,
    client_config: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A subscription's consumer; ``client_config`` says how to reach the broker
    (:meth:`setu.settings.Settings.kafka_client_config`, docs/security.md §8)."""
    return {
        "bootstrap.servers": bootstrap,
        **(client_config or {}),
        "group.id": group,
        "client.id": client_id,
        # All tiers of a partition index land on one worker (docs/design.md §1).
        "partition.assignment.strategy": "range",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        "fetch.wait.max.ms": 100,
        # Bounded prefetch: memory stays flat however far behind the worker is.
        "queued.max.messages.kbytes": 8192,
        "queued.min.messages": 5000,
        # One fetch holds any record Setu accepted (setu.limits).
        "max.partition.fetch.bytes": limits.fetch_bytes,
        # A worker that died gives its partitions up after this long.
        "session.timeout.ms": 10000,
        "max.poll.interval.ms": 300000,
    }


def copy_producer_config(
    bootstrap: str,
    client_id: str,
    limits: MessageLimits,
    client_config: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The worker's producer of copies (retry tiers, DLQ); ``client_config`` as above."""
    return {
        **durable_producer(bootstrap, client_config),
        "client.id": client_id,
        "linger.ms": 2,
        # librdkafka retries a copy until then (idempotent: never twice); a copy that fails
        # fails its runner, which takes all its partitions over again. Brokers making the
        # tiers of a thousand subscriptions failing at once (decision 0014) kept the first
        # copies to them waiting past 30 s: 138 runners failed, and their records were
        # delivered again.
        "message.timeout.ms": 120_000,
        "topic.metadata.propagation.max.ms": 120_000,
        # A copy of any record Setu accepted fits (librdkafka's default is 1,000,000 bytes:
        # a large message failing once would stop its partition's delivery).
        "message.max.bytes": limits.request_bytes,
    }


class ConsumerThread:
    """One consumer, polled on a dedicated thread (see the module doc)."""

    def __init__(
        self,
        config: dict[str, Any],
        loop: asyncio.AbstractEventLoop,
        listener: RebalanceListener,
        poll_timeout_s: float = POLL_TIMEOUT_S,
    ) -> None:
        """``poll_timeout_s``: the longest wait between commands (a record ends it at once);
        longer costs less while idle and delays the owner's commands (pause, commit) more."""
        self._config = config
        self._poll_timeout_s = poll_timeout_s
        self._topics: list[str] = []
        self._loop = loop
        self._listener = listener
        # (command, callback, whether the callback takes the command's result and error)
        self._commands: queue.SimpleQueue[
            tuple[Callable[[Consumer], Any], Callable[..., None] | None, bool]
        ] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._outstanding = threading.Semaphore(MAX_OUTSTANDING_BATCHES)
        # Cleared by the owner while it holds as many records as it wants: the thread stops
        # consuming, librdkafka's bounded prefetch fills up, and fetching stops by itself.
        # Not polling also means not serving rebalances, so the owner clears it only briefly
        # (it pauses its partitions when it stays full).
        self.flowing = threading.Event()
        self.flowing.set()
        self._done: asyncio.Future[None] = loop.create_future()
        self._failure: BaseException | None = None  # a takeover that failed (see _assign)
        self._thread = threading.Thread(target=self._run, name=f"consumer-{config['group.id']}")

    def start(self, topics: Sequence[str]) -> None:
        """Subscribes to ``topics`` and starts polling."""
        self._topics = list(topics)
        self._thread.start()

    def post(
        self, command: Callable[[Consumer], Any], then: Callable[[], None] | None = None
    ) -> None:
        """Runs ``command`` on the consumer thread; then posts ``then`` to the loop."""
        self._commands.put((command, then, False))

    async def call(self, command: Callable[[Consumer], T]) -> T:
        """Runs ``command`` on the consumer thread and returns its result."""
        future: asyncio.Future[T] = self._loop.create_future()

        def settle(result: Any, error: BaseException | None) -> None:
            if future.done():
                return
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(result)

        self._commands.put((command, settle, True))
        return await future

    async def close(self) -> None:
        """Stops polling and closes the consumer (which revokes, drains and commits). An error
        that ended the thread was logged there and is in :attr:`done`; it is not raised."""
        self._stop.set()
        await asyncio.wait([self._done])
        if not self._done.cancelled():
            self._done.exception()  # retrieved: the owner reads it from ``done``

    @property
    def running(self) -> bool:
        return not self._done.done()

    @property
    def done(self) -> asyncio.Future[None]:
        """Resolves when the thread ends: with the error that ended it, if any."""
        return self._done

    def _run(self) -> None:
        consumer: Consumer | None = None
        error: BaseException | None = None
        try:
            consumer = Consumer(self._config, logger=log)
            self._opened(consumer)
            while not self._stop.is_set():
                if self._failure is not None:
                    raise self._failure
                self._run_commands(consumer)
                if not self._may_take(consumer):
                    continue
                if not self._outstanding.acquire(timeout=self._poll_timeout_s):
                    continue
                messages = take(consumer, self._poll_timeout_s)
                if messages:
                    self._loop.call_soon_threadsafe(self._hand_over, messages)
                else:
                    self._outstanding.release()
            self._run_commands(consumer)
        except BaseException as exc:
            error = exc
            log.exception("consumer of %s failed", self._config["group.id"])
        finally:
            if consumer is not None:
                try:
                    consumer.close()
                except (KafkaException, RuntimeError):
                    log.exception("closing consumer of %s", self._config["group.id"])
            self._loop.call_soon_threadsafe(self._finish, error)

    def _opened(self, consumer: Consumer) -> None:
        """Right after the consumer is made: it joins its group for its topics."""
        consumer.subscribe(
            self._topics, on_assign=self._assign, on_revoke=self._revoke, on_lost=self._lost
        )

    def _may_take(self, consumer: Consumer) -> bool:
        """Whether to take records now: not while the owner holds as many as it wants."""
        return self.flowing.wait(self._poll_timeout_s)

    def _hand_over(self, messages: list[Message]) -> None:
        try:
            self._listener.on_batch(messages)
        finally:
            self._outstanding.release()

    def _finish(self, error: BaseException | None) -> None:
        if self._done.done():
            return
        if error is not None:
            self._done.set_exception(error)
        else:
            self._done.set_result(None)

    def _run_commands(self, consumer: Consumer) -> None:
        while True:
            try:
                command, then, with_result = self._commands.get_nowait()
            except queue.Empty:
                return
            result: Any = None
            error: BaseException | None = None
            try:
                result = command(consumer)
            except (KafkaException, RuntimeError, ValueError) as exc:
                error = exc
                log.warning("consumer command failed: %s", exc)
            if then is None:
                continue
            if with_result:
                self._loop.call_soon_threadsafe(then, result, error)
            else:
                self._loop.call_soon_threadsafe(then)

    def _wait(self, coro: Awaitable[T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()  # type: ignore[arg-type]

    def _assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        try:
            committed = consumer.committed(partitions, timeout=30)
            plan = self._wait(self._listener.assigned(committed))
        except BaseException as error:
            # The takeover failed (Redis away, say): take nothing of this assignment and end
            # the thread. An assignment left half-made when the consumer closes makes
            # librdkafka abort the process (rd_kafka_cgrp_terminated's assertion).
            self._failure = error
            consumer.unassign()
            return
        consumer.assign(plan.starts)
        # librdkafka keeps a partition's pause through a revocation and a new assignment of
        # the same partition: a pause made for the previous assignment (a retry tier held
        # until a record is due, say) would stop the partition for good. Each assignment
        # starts from the owner's own view.
        consumer.resume(plan.starts)
        if plan.paused:
            consumer.pause(plan.paused)
        if plan.commit_now:
            consumer.commit(offsets=plan.commit_now, asynchronous=False)
            if plan.after_commit is not None:
                self._wait(plan.after_commit())

    def _revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        offsets = self._wait(self._listener.revoked(partitions))
        if not offsets:
            return
        try:
            consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as exc:
            log.warning("commit on revocation failed: %s", exc)
            return
        self._loop.call_soon_threadsafe(self._listener.committed, offsets)

    def _lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._loop.call_soon_threadsafe(self._listener.lost, partitions)


class DroppedWrite(Exception):
    """Kafka acknowledged a record at an offset it had already acknowledged another at: the
    record was not written (see :class:`AckOrder`)."""


class AckOrder:
    """The offsets one idempotent producer was acknowledged at, per partition. They rise: the
    producer keeps each partition's records in order. A record acknowledged at an offset no
    higher than an earlier one was taken by the broker for a duplicate and dropped: a producer
    whose sequence numbers for a partition started over (its metadata of a topic made a moment
    before said the topic was gone, then back) had a subscription's first copy to a new retry
    tier acknowledged at the offset of another group's copy, and the group then waited for a
    record that was never written (the 100-subscription crash run of 2026-11-30,
    bench/results/crash-100-subscriptions-8m-shared-changelog-stuck.md). Such a record is
    reported as failed, so its writer never counts it; after one, the partition is watched
    afresh (a topic deleted and made again starts its offsets at 0 again)."""

    def __init__(self) -> None:
        self._highest: dict[tuple[str, int], int] = {}

    def acknowledged(self, topic: str, partition: int, offset: int) -> bool:
        """Whether ``offset`` is above every offset acknowledged before on the partition."""
        key = (topic, partition)
        if offset <= self._highest.get(key, -1):
            del self._highest[key]
            return False
        self._highest[key] = offset
        return True


class AsyncProducer:
    """A ``confluent_kafka.Producer`` whose writes can be awaited until acknowledged."""

    def __init__(self, config: dict[str, Any], loop: asyncio.AbstractEventLoop) -> None:
        self._producer = Producer(config, logger=log)
        self._acks = AckOrder()
        self._loop = loop
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="producer", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            self._producer.poll(0.05)

    async def send(
        self,
        topic: str,
        partition: int,
        records: Sequence[tuple[bytes, bytes | None, KafkaHeaders]],
    ) -> list[int]:
        """Writes ``records`` (key, value, headers) in order to one partition; returns their
        offsets once all are acknowledged, or raises KafkaException."""
        futures: list[asyncio.Future[int]] = []
        for key, value, headers in records:
            future: asyncio.Future[int] = self._loop.create_future()
            futures.append(future)
            while True:
                try:
                    self._producer.produce(
                        topic,
                        value=value,
                        key=key,
                        partition=partition,
                        headers=list(headers),
                        on_delivery=self._settler(future),
                    )
                    break
                except BufferError:
                    await asyncio.sleep(0.01)
        return [await f for f in futures]

    def _settler(self, future: asyncio.Future[int]) -> Callable[[KafkaError | None, Message], None]:
        loop = self._loop

        def on_delivery(error: KafkaError | None, message: Message) -> None:
            loop.call_soon_threadsafe(self._settle, future, error, message)

        return on_delivery

    def _settle(
        self, future: asyncio.Future[int], error: KafkaError | None, message: Message
    ) -> None:
        """On the loop: delivery reports arrive in each partition's order."""
        offset = message.offset() or 0
        if error is None and not self._acks.acknowledged(
            message.topic() or "", message.partition() or 0, offset
        ):
            log.error(
                "%s [%s]: a record was acknowledged at offset %d, at or below one acknowledged "
                "before: Kafka took it for a duplicate and did not write it; reported as failed",
                message.topic(),
                message.partition(),
                offset,
            )
            if not future.done():
                future.set_exception(DroppedWrite(f"{message.topic()} [{message.partition()}]"))
            return
        _settle(future, error, offset)

    async def close(self, timeout_s: float = 10.0) -> None:
        await asyncio.to_thread(self._producer.flush, timeout_s)
        self._stop.set()
        await asyncio.to_thread(self._thread.join, 1.0)


def _settle(future: asyncio.Future[int], error: KafkaError | None, offset: int) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(KafkaException(error))
    else:
        future.set_result(offset)
