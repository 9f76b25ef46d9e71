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
import time
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, TypeVar, cast

from confluent_kafka import (
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)

from setu.envelope import H_PRODUCED_AT, KafkaHeaders
from setu.limits import MessageLimits
from setu.ordering.records import Record, parse_record
from setu.ordering.tiers import DLQ
from setu.producer_settings import durable_producer

log = logging.getLogger(__name__)

# What a watermark read says of a topic that does not exist (yet).
_MISSING = frozenset({KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_PARTITION})
_MOVING = frozenset({KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE})
# What a committed-offsets read says while the group's coordinator is being found or loaded.
_COORDINATOR_MOVING = frozenset(
    {
        KafkaError.NOT_COORDINATOR,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
    }
)
T = TypeVar("T")

POLL_BATCH = 500
# How long a watermark read is tried again while a partition's leader moves (a broker
# restarting, a node lost: docs/design.md §7), before it fails its caller.
WATERMARK_TIMEOUT_S = 10.0
POLL_TIMEOUT_S = 0.05
# Batches handed to the loop and not yet processed; the thread waits beyond this, so a loop
# that falls behind slows the consumer instead of piling batches up in memory.
MAX_OUTSTANDING_BATCHES = 2


def take(consumer: Consumer) -> list[Message]:
    """What the consumer holds now, up to ``POLL_BATCH``, waiting at most ``POLL_TIMEOUT_S``
    for the first. A lone message is handed on as soon as it arrives: ``consume()`` alone
    waits out its whole timeout unless a full batch is there (measured: p50 28 ms of every
    message's wait in the main log at 200 msg/s, docs/latency.md)."""
    first = consumer.poll(POLL_TIMEOUT_S)
    if first is None:
        return []
    return [first, *consumer.consume(POLL_BATCH - 1, 0)]


def record_of(tier: int, msg: Message, read_ms: int = 0) -> Record:
    """The delivery record of a consumed message, read at ``read_ms``; raises ValueError for a
    foreign one."""
    headers = cast("list[tuple[str, bytes | None]] | None", msg.headers())
    return parse_record(tier, msg.offset() or 0, headers, msg.value(), read_ms)


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
        "message.timeout.ms": 30000,
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
    ) -> None:
        self._config = config
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
            consumer.subscribe(
                self._topics, on_assign=self._assign, on_revoke=self._revoke, on_lost=self._lost
            )
            while not self._stop.is_set():
                if self._failure is not None:
                    raise self._failure
                self._run_commands(consumer)
                if not self.flowing.wait(POLL_TIMEOUT_S):
                    continue
                if not self._outstanding.acquire(timeout=POLL_TIMEOUT_S):
                    continue
                messages = take(consumer)
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


class AsyncProducer:
    """A ``confluent_kafka.Producer`` whose writes can be awaited until acknowledged."""

    def __init__(self, config: dict[str, Any], loop: asyncio.AbstractEventLoop) -> None:
        self._producer = Producer(config, logger=log)
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
            loop.call_soon_threadsafe(_settle, future, error, message.offset() or 0)

        return on_delivery

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


@dataclass(slots=True)
class Tails:
    """What :meth:`KafkaReader.tails` read, per (topic, partition)."""

    records: dict[tuple[str, int], list[Message]] = field(default_factory=dict)
    ends: dict[tuple[str, int], int] = field(default_factory=dict)  # end offsets when read
    lows: dict[tuple[str, int], int] = field(default_factory=dict)  # first offsets then

    def get(self, key: tuple[str, int], default: list[Message]) -> list[Message]:
        return self.records.get(key, default)


@dataclass(frozen=True, slots=True)
class Backlog:
    """One topic partition of a subscription: records not finished, from ``start``."""

    topic: str
    partition: int
    lag: int
    start: int
    # When the oldest of them was produced (ms), where asked for and readable.
    oldest_ms: int | None = None


def produced_at(msg: Message) -> int:
    """When a record's message was produced: Setu's header, else the record's timestamp."""
    headers = msg.headers() or []
    pairs = headers.items() if isinstance(headers, dict) else headers
    for name, value in pairs:
        if name == H_PRODUCED_AT and value:
            return int(value)
    return int(msg.timestamp()[1])


def _asked_again(ask: Callable[[float], T], passing: frozenset[int], deadline: float) -> T:
    """``ask(timeout_s)``, asked again until ``deadline`` while it fails with one of the
    ``passing`` error codes (a leader or coordinator moving); raises KafkaException
    otherwise."""
    while True:
        try:
            return ask(max(0.1, deadline - time.monotonic()))
        except KafkaException as exc:
            if exc.args[0].code() not in passing or time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def committed(
    consumer: Consumer, partitions: list[TopicPartition], deadline: float
) -> list[TopicPartition]:
    """The group's committed offsets of ``partitions``, asked again until ``deadline`` while
    the group's coordinator is being found or loaded. Raises KafkaException otherwise."""

    def ask(timeout_s: float) -> list[TopicPartition]:
        found: list[TopicPartition] = consumer.committed(partitions, timeout=timeout_s)
        return found

    return _asked_again(ask, _COORDINATOR_MOVING, deadline)


def watermarks(
    consumer: Consumer, tp: TopicPartition, deadline: float, *, wait_for_missing: bool
) -> tuple[int, int]:
    """A partition's low and high watermarks, asked again until ``deadline`` while a new
    topic's leaders are being elected, and with ``wait_for_missing`` while the brokers do not
    know the topic yet (one just created is not on every broker at once). Raises
    KafkaException otherwise."""

    def ask(timeout_s: float) -> tuple[int, int]:
        low, high = consumer.get_watermark_offsets(tp, timeout=timeout_s, cached=False)
        return int(low), int(high)

    return _asked_again(ask, _MOVING | _MISSING if wait_for_missing else _MOVING, deadline)


class KafkaReader:
    """Short reads outside the consumer group: tails and offsets for a time. Blocking; call
    the methods in a worker thread."""

    def __init__(self, bootstrap: str, client_config: Mapping[str, str] | None = None) -> None:
        self._config = {
            "bootstrap.servers": bootstrap,
            **(client_config or {}),
            # Never joins or commits: it only assigns partitions.
            "group.id": "setu-delivery-reader",
            "enable.auto.commit": False,
            "enable.partition.eof": False,
        }

    def tails(self, starts: Sequence[TopicPartition], timeout_s: float = 60.0) -> Tails:
        """Every record from each start offset (OFFSET_BEGINNING for none) to the end, with
        the end and the first offset of each partition as they were when reading began."""
        tails = Tails()
        out = tails.records
        consumer = Consumer(self._config, logger=log)
        try:
            ends: dict[tuple[str, int], int] = {}
            todo = []
            deadline = time.monotonic() + WATERMARK_TIMEOUT_S
            for tp in starts:
                low, high = watermarks(consumer, tp, deadline, wait_for_missing=False)
                start = tp.offset if tp.offset >= 0 else low
                out[(tp.topic, tp.partition)] = []
                tails.ends[(tp.topic, tp.partition)] = high
                tails.lows[(tp.topic, tp.partition)] = low
                if max(start, low) < high:
                    ends[(tp.topic, tp.partition)] = high
                    todo.append(TopicPartition(tp.topic, tp.partition, max(start, low)))
            if not todo:
                return tails
            consumer.assign(todo)
            deadline = time.monotonic() + timeout_s
            while ends:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"reading the tails of {sorted(ends)} took too long")
                for msg in consumer.consume(POLL_BATCH, 0.2):
                    topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
                    if msg.error() or topic is None or partition is None or offset is None:
                        continue
                    key = (topic, partition)
                    end = ends.get(key)
                    if end is None or offset >= end:
                        continue
                    out[key].append(msg)
                    if offset >= end - 1:
                        del ends[key]
            return tails
        finally:
            consumer.close()

    def read(
        self, topic: str, partition: int, start: int, budget: int
    ) -> tuple[list[Message], int, bool]:
        """Up to ``budget`` records of one partition from ``start`` (clamped to the log start):
        the records, the offset to continue from, and whether the end was reached."""
        consumer = Consumer(self._config, logger=log)
        try:
            tp = TopicPartition(topic, partition)
            deadline = time.monotonic() + WATERMARK_TIMEOUT_S
            low, high = watermarks(consumer, tp, deadline, wait_for_missing=False)
            start = max(start, low)
            if start >= high:
                return [], start, True
            consumer.assign([TopicPartition(topic, partition, start)])
            out: list[Message] = []
            position = start
            deadline = time.monotonic() + 30
            while position < high and len(out) < budget:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"reading {topic}/{partition} took too long")
                for msg in consumer.consume(min(POLL_BATCH, budget - len(out)), 0.2):
                    offset = msg.offset()
                    if msg.error() or offset is None or offset < position:
                        continue
                    out.append(msg)
                    position = offset + 1
            return out, position, position >= high
        finally:
            consumer.close()

    def first_offset(self, topic: str, partition: int) -> int:
        """The first offset retention left in one partition."""
        consumer = Consumer(self._config, logger=log)
        try:
            deadline = time.monotonic() + WATERMARK_TIMEOUT_S
            tp = TopicPartition(topic, partition)
            low, _ = watermarks(consumer, tp, deadline, wait_for_missing=False)
            return low
        finally:
            consumer.close()

    def existing(self, topics: Sequence[str]) -> set[str]:
        """Which of ``topics`` exist now."""
        consumer = Consumer(self._config, logger=log)
        try:
            known = consumer.list_topics(timeout=10).topics
            return {t for t in topics if t in known and known[t].error is None}
        finally:
            consumer.close()

    def offset_for_time(self, topic: str, partition: int, timestamp_ms: int) -> int:
        """The first offset at or after ``timestamp_ms``, or the end when there is none."""
        consumer = Consumer(self._config, logger=log)
        try:
            found = consumer.offsets_for_times(
                [TopicPartition(topic, partition, timestamp_ms)], timeout=10
            )[0]
            if found.offset >= 0:
                return int(found.offset)
            deadline = time.monotonic() + WATERMARK_TIMEOUT_S
            tp = TopicPartition(topic, partition)
            _, high = watermarks(consumer, tp, deadline, wait_for_missing=False)
            return high
        finally:
            consumer.close()

    def records_held(self, topic: str, partitions: int, timeout_s: float = 10.0) -> int:
        """How many records ``topic`` holds now (0 when it does not exist)."""
        consumer = Consumer({**self._config, "group.id": "setu-records-held"}, logger=log)
        try:
            held = 0
            deadline = time.monotonic() + timeout_s
            for partition in range(partitions):
                tp = TopicPartition(topic, partition)
                try:
                    low, high = watermarks(consumer, tp, deadline, wait_for_missing=False)
                except KafkaException as exc:
                    if exc.args[0].code() in _MISSING:
                        return 0
                    raise
                held += high - low
            return held
        finally:
            consumer.close()

    def backlog(
        self,
        group: str,
        topics: dict[str, int],
        oldest_of: Collection[str],
        timeout_s: float = 10.0,
    ) -> list[Backlog]:
        """Per topic partition, records between the group's committed offset and the end;
        for the topics in ``oldest_of``, also when the first of them was produced. The
        committed offset is the lowest unfinished record (delivery commits no further), and
        a partition is in produce order, so that record is the oldest one undelivered."""
        consumer = Consumer({**self._config, "group.id": group}, logger=log)
        try:
            partitions = [
                TopicPartition(topic, p) for topic, count in topics.items() for p in range(count)
            ]
            out: list[Backlog] = []
            deadline = time.monotonic() + timeout_s
            # A new subscription's consumer group has no coordinator at first
            for tp in committed(consumer, partitions, deadline):
                # The topics exist (the subscription made them), maybe only just
                low, high = watermarks(consumer, tp, deadline, wait_for_missing=True)
                start = max(tp.offset if tp.offset >= 0 else low, low)
                out.append(Backlog(tp.topic, tp.partition, max(0, high - start), start))
        finally:
            consumer.close()
        firsts = [b for b in out if b.lag and b.topic in oldest_of]
        if firsts:
            produced = self._produced_at(firsts, timeout_s)
            out = [replace(b, oldest_ms=produced.get((b.topic, b.partition))) for b in out]
        return out

    def _produced_at(
        self, starts: Sequence[Backlog], timeout_s: float
    ) -> dict[tuple[str, int], int]:
        """When the record at each start offset was produced (its produce-time header, else
        its Kafka timestamp)."""
        consumer = Consumer(self._config, logger=log)
        try:
            consumer.assign([TopicPartition(b.topic, b.partition, b.start) for b in starts])
            wanted = {(b.topic, b.partition): b.start for b in starts}
            found: dict[tuple[str, int], int] = {}
            deadline = time.monotonic() + timeout_s
            while len(found) < len(wanted) and time.monotonic() < deadline:
                for msg in consumer.consume(len(wanted), 0.2):
                    key = (msg.topic() or "", msg.partition() or 0)
                    if msg.error() or key in found or msg.offset() != wanted.get(key):
                        continue
                    found[key] = produced_at(msg)
            return found
        finally:
            consumer.close()


class DeadLetterReader:
    """A subscription's DLQ read through a :class:`KafkaReader`
    (:class:`delivery.operations.DeadLetterLog`)."""

    def __init__(self, reader: KafkaReader, topic: str) -> None:
        self._reader = reader
        self._topic = topic

    async def read(self, partition: int, start: int, budget: int) -> tuple[list[Record], int, bool]:
        messages, position, end = await asyncio.to_thread(
            self._reader.read, self._topic, partition, start, budget
        )
        records = []
        for msg in messages:
            try:
                records.append(record_of(DLQ, msg))
            except ValueError:
                continue  # not a Setu record
        return records, position, end
