"""Short reads of Kafka outside any consumer group: the tails of retry tiers, offsets for a
time, watermarks, committed offsets, backlogs and dead letters. Blocking; the API (operator
views, the dead-letter queue), delivery's takeover and the tools call them in a worker thread.
Leader and coordinator moves (a broker restarting, a node lost: docs/design.md §7) are asked
again for a while before they fail the caller.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import TypeVar, cast

from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicCollection,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient

from setu.envelope import H_PRODUCED_AT
from setu.ordering.records import Record, parse_record
from setu.ordering.tiers import DLQ

log = logging.getLogger(__name__)

# What a watermark read says of a topic that does not exist (yet).
_MISSING = frozenset({KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_PARTITION})
_MOVING = frozenset({KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE})
# What a committed-offsets read says while the group's coordinator is being found or loaded.
COORDINATOR_MOVING = frozenset(
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
# How long a failed ask of many partitions' watermarks is asked again before each topic is
# asked on its own (all_watermarks).
TOGETHER_AGAIN_S = 2.0
# Group-less consumers a reader keeps between reads (KafkaReader._borrowed).
IDLE_CONSUMERS = 2


def record_of(tier: int, msg: Message, read_ms: int = 0) -> Record:
    """The delivery record of a consumed message, read at ``read_ms``; raises ValueError for a
    foreign one."""
    headers = cast("list[tuple[str, bytes | None]] | None", msg.headers())
    return parse_record(tier, msg.offset() or 0, headers, msg.value(), read_ms)


@dataclass(slots=True)
class Tails:
    """What :meth:`KafkaReader.tails` read, per (topic, partition)."""

    records: dict[tuple[str, int], list[Message]] = field(default_factory=dict)
    ends: dict[tuple[str, int], int] = field(default_factory=dict)  # end offsets when read
    lows: dict[tuple[str, int], int] = field(default_factory=dict)  # first offsets then

    def get(self, key: tuple[str, int], default: list[Message]) -> list[Message]:
        return self.records.get(key, default)

    def part(self, keys: Collection[tuple[str, int]]) -> Tails:
        """What was read of ``keys`` only (one caller's share of a read made for many)."""
        return Tails(
            {k: v for k, v in self.records.items() if k in keys},
            {k: v for k, v in self.ends.items() if k in keys},
            {k: v for k, v in self.lows.items() if k in keys},
        )


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

    return _asked_again(ask, COORDINATOR_MOVING, deadline)


def committed_offsets(
    bootstrap: str,
    client_config: Mapping[str, str],
    group: str,
    partitions: list[TopicPartition],
    deadline: float,
) -> list[TopicPartition]:
    """``group``'s committed offsets of ``partitions`` (with their metadata), read by a
    consumer of the group that never subscribes, so it never joins it."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            **client_config,
            "group.id": group,
            "enable.auto.commit": False,
        },
        logger=log,
    )
    try:
        return committed(consumer, partitions, deadline)
    finally:
        consumer.close()


def existing_topics(admin: AdminClient, topics: Sequence[str], timeout_s: float) -> set[str]:
    """Which of ``topics`` exist now, asked in one request naming them. A topic the broker
    does not know is left out; any other failure (Kafka away, no answer in time) raises, so
    that a caller never takes a topic it could not see for one that does not exist."""
    if not topics:
        return set()
    futures = admin.describe_topics(
        TopicCollection(list(dict.fromkeys(topics))), request_timeout=timeout_s
    )
    found = set()
    for name, future in futures.items():
        try:
            future.result(timeout=timeout_s)
        except KafkaException as exc:
            if exc.args[0].code() in _MISSING:
                continue
            raise
        found.add(name)
    return found


def watermarks(
    consumer: Consumer, tp: TopicPartition, deadline: float, *, wait_for_missing: bool
) -> tuple[int, int]:
    """A partition's low and high watermarks, asked again until ``deadline`` while a new
    topic's leaders are being elected, and with ``wait_for_missing`` while the brokers do not
    know the topic yet (one just created is not on every broker at once). Raises
    KafkaException otherwise."""

    def ask(timeout_s: float) -> tuple[int, int]:
        try:
            low, high = consumer.get_watermark_offsets(tp, timeout=timeout_s, cached=False)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError._UNKNOWN_PARTITION:
                raise
            # The client's own metadata lacks the partition: a consumer kept between reads
            # (KafkaReader._borrowed) asked before the topic was made. Seen with 100 new
            # subscriptions' changelogs read right after they were made; ask it afresh once.
            consumer.list_topics(topic=tp.topic, timeout=timeout_s)
            low, high = consumer.get_watermark_offsets(tp, timeout=timeout_s, cached=False)
        return int(low), int(high)

    return _asked_again(ask, _MOVING | _MISSING if wait_for_missing else _MOVING, deadline)


def all_watermarks(
    consumer: Consumer, tps: Sequence[TopicPartition], deadline: float
) -> dict[tuple[str, int], tuple[int, int]]:
    """:func:`watermarks` of many partitions in two requests to each leader (first offsets,
    then ends: ListOffsets with the earliest and latest markers, under the consumer's
    isolation level as a watermark read), however many partitions: a worker taking over a
    thousand subscriptions asks for tens of thousands. A topic that does not exist fails
    such an ask whole: it is asked again for :data:`TOGETHER_AGAIN_S`, then each topic on
    its own; a partition still without an answer (its topic missing, a leader moving) is
    asked alone, as :func:`watermarks` does, and raises as it does."""
    keys = list(dict.fromkeys((tp.topic, tp.partition) for tp in tps))
    found: dict[tuple[str, int], tuple[int, int]] = {}
    if len(keys) > 1:
        together = _asked_together(consumer, keys, deadline)
        # A topic made a moment ago may not be on every broker yet: asked again for a while.
        again = min(deadline, time.monotonic() + TOGETHER_AGAIN_S)
        while together is None and time.monotonic() < again:
            time.sleep(0.2)
            together = _asked_together(consumer, keys, deadline)
        if together is None:
            by_topic: dict[str, list[tuple[str, int]]] = {}
            for key in keys:
                by_topic.setdefault(key[0], []).append(key)
            together = {}
            for own in by_topic.values():
                together.update(_asked_together(consumer, own, deadline) or {})
        found.update(together)
    for topic, partition in keys:
        if (topic, partition) not in found:
            found[(topic, partition)] = watermarks(
                consumer, TopicPartition(topic, partition), deadline, wait_for_missing=False
            )
    return found


def _asked_together(
    consumer: Consumer, keys: Sequence[tuple[str, int]], deadline: float
) -> dict[tuple[str, int], tuple[int, int]] | None:
    """The watermarks of ``keys`` in one ask of their first offsets and one of their ends:
    those answered, or None when the ask failed whole."""
    timeout_s = max(0.1, deadline - time.monotonic())
    try:
        lows = consumer.offsets_for_times(
            [TopicPartition(t, p, OFFSET_BEGINNING) for t, p in keys], timeout=timeout_s
        )
        highs = consumer.offsets_for_times(
            [TopicPartition(t, p, OFFSET_END) for t, p in keys], timeout=timeout_s
        )
    except KafkaException:
        return None
    return {
        (low.topic, low.partition): (int(low.offset), int(high.offset))
        for low, high in zip(lows, highs, strict=True)
        if low.error is None and high.error is None and min(low.offset, high.offset) >= 0
    }


# Partitions one read together takes at most (KafkaReader.tails_together), and how many such
# reads run at once: one slow read (a long tail) does not hold every caller.
TOGETHER_PARTITIONS = 2_000
TOGETHER_READS = 2


class _TailBatches:
    """Concurrent :meth:`KafkaReader.tails_together` calls of one event loop, served by a few
    reads in worker threads, each for as many callers as its partition bound allows."""

    def __init__(self, reader: KafkaReader) -> None:
        self._reader = reader
        self._waiting: list[tuple[list[TopicPartition], asyncio.Future[Tails]]] = []
        self._reads: set[asyncio.Task[None]] = set()

    async def tails(self, starts: Sequence[TopicPartition]) -> Tails:
        future: asyncio.Future[Tails] = asyncio.get_running_loop().create_future()
        self._waiting.append((list(starts), future))
        # A read that just ended is done before its callback leaves the set.
        if sum(not read.done() for read in self._reads) < TOGETHER_READS:
            task = asyncio.get_running_loop().create_task(self._serve())
            self._reads.add(task)
            task.add_done_callback(self._reads.discard)
        return await future

    def _next_batch(self) -> list[tuple[list[TopicPartition], asyncio.Future[Tails]]]:
        """Waiting callers whose partitions are distinct (one partition read from two
        starts at once would read from the lower), up to the bound; the rest wait."""
        batch: list[tuple[list[TopicPartition], asyncio.Future[Tails]]] = []
        rest: list[tuple[list[TopicPartition], asyncio.Future[Tails]]] = []
        keys: set[tuple[str, int]] = set()
        for starts, future in self._waiting:
            if future.done():
                continue  # its caller was cancelled
            own = {(tp.topic, tp.partition) for tp in starts}
            if batch and (own & keys or len(keys) + len(own) > TOGETHER_PARTITIONS):
                rest.append((starts, future))
                continue
            batch.append((starts, future))
            keys |= own
        self._waiting = rest
        return batch

    async def _serve(self) -> None:
        while batch := self._next_batch():
            everything = [tp for starts, _ in batch for tp in starts]
            try:
                read = await asyncio.to_thread(self._reader.tails, everything)
            except Exception as exc:
                if len(batch) == 1:
                    _settle(batch[0][1], exc)
                    continue
                # Each on its own: one partition that cannot be read fails only its caller.
                for starts, future in batch:
                    try:
                        _settle(future, await asyncio.to_thread(self._reader.tails, starts))
                    except Exception as alone:
                        _settle(future, alone)
                continue
            for starts, future in batch:
                _settle(future, read.part({(tp.topic, tp.partition) for tp in starts}))


def _settle(future: asyncio.Future[Tails], outcome: Tails | BaseException) -> None:
    if future.done():
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)


class KafkaReader:
    """Short reads outside the consumer group: tails and offsets for a time. Blocking; call
    the methods in a worker thread."""

    def __init__(self, bootstrap: str, client_config: Mapping[str, str] | None = None) -> None:
        self._client_config: dict[str, str | int | float | bool] = {
            "bootstrap.servers": bootstrap,
            **(client_config or {}),
        }
        self._admin: AdminClient | None = None  # see _admin_client
        self._admin_made = threading.Lock()
        self._config = {
            **self._client_config,
            # Never joins or commits: it only assigns partitions.
            "group.id": "setu-delivery-reader",
            "enable.auto.commit": False,
            "enable.partition.eof": False,
        }
        self._idle: list[Consumer] = []  # see _borrowed
        self._together: _TailBatches | None = None

    @contextmanager
    def _borrowed(self) -> Iterator[Consumer]:
        """A group-less consumer of the pool, or a new one when none is free. It goes back
        unassigned when the read went well, and is closed otherwise (or when the pool is
        full): a consumer's creation and first connection cost more than most reads here
        (a worker taking over a hundred subscriptions reads each partition's changelog
        twice), and librdkafka's client keeps its connections between reads."""
        try:
            consumer = self._idle.pop()
        except IndexError:
            consumer = Consumer(self._config, logger=log)
        try:
            yield consumer
        except BaseException:
            consumer.close()
            raise
        try:
            consumer.unassign()
        except KafkaException:
            consumer.close()
            return
        if len(self._idle) < IDLE_CONSUMERS:
            self._idle.append(consumer)
        else:
            consumer.close()

    def close(self) -> None:
        """Closes the consumers kept for later reads."""
        while self._idle:
            self._idle.pop().close()

    def tails(self, starts: Sequence[TopicPartition], timeout_s: float = 60.0) -> Tails:
        """Every record from each start offset (OFFSET_BEGINNING for none) to the end, with
        the end and the first offset of each partition as they were when reading began."""
        tails = Tails()
        out = tails.records
        with self._borrowed() as consumer:
            ends: dict[tuple[str, int], int] = {}
            todo = []
            deadline = time.monotonic() + WATERMARK_TIMEOUT_S
            # The next offset each partition's reading takes: a record before it (one a
            # consumer of the pool fetched for an earlier read) is not taken twice.
            nexts: dict[tuple[str, int], int] = {}
            marks = all_watermarks(consumer, starts, deadline)
            for tp in starts:
                low, high = marks[(tp.topic, tp.partition)]
                start = tp.offset if tp.offset >= 0 else low
                out[(tp.topic, tp.partition)] = []
                tails.ends[(tp.topic, tp.partition)] = high
                tails.lows[(tp.topic, tp.partition)] = low
                if max(start, low) < high:
                    ends[(tp.topic, tp.partition)] = high
                    nexts[(tp.topic, tp.partition)] = max(start, low)
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
                    if end is None or offset >= end or offset < nexts[key]:
                        continue
                    nexts[key] = offset + 1
                    out[key].append(msg)
                    if offset >= end - 1:
                        del ends[key]
            return tails

    async def tails_together(self, starts: Sequence[TopicPartition]) -> Tails:
        """:meth:`tails` of ``starts``, read in one go with those other callers on this
        event loop ask for meanwhile: a worker taking over a thousand subscriptions reads
        their tiers' and changelogs' tails in a few reads, not a few thousand (every read
        asks each partition's watermarks and most of those tails are empty). Call it from
        one event loop only."""
        if self._together is None:
            self._together = _TailBatches(self)
        return await self._together.tails(starts)

    def read(
        self, topic: str, partition: int, start: int, budget: int
    ) -> tuple[list[Message], int, bool]:
        """Up to ``budget`` records of one partition from ``start`` (clamped to the log start):
        the records, the offset to continue from, and whether the end was reached."""
        with self._borrowed() as consumer:
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

    def read_offsets(
        self, topic: str, partition: int, offsets: Sequence[int], gap: int = 2_000
    ) -> dict[int, Message]:
        """The records at ``offsets`` of one partition, read in one pass from the lowest:
        forward through records between wanted ones, jumping (a new assignment) where the next
        wanted offset is more than ``gap`` ahead. Offsets retention deleted, or past the end,
        are left out. A thousand scattered offsets cost a few fetches, not a thousand reads
        (docs/scheduling.md)."""
        with self._borrowed() as consumer:
            tp = TopicPartition(topic, partition)
            deadline = time.monotonic() + WATERMARK_TIMEOUT_S
            low, high = watermarks(consumer, tp, deadline, wait_for_missing=False)
            wanted = sorted({o for o in offsets if low <= o < high})
            out: dict[int, Message] = {}
            at = 0  # the next wanted offset's index
            position = -1  # the offset the assignment reads next; -1: none
            deadline = time.monotonic() + 30 + len(wanted) / 100
            while at < len(wanted):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"reading {topic}/{partition} took too long")
                if position < 0 or wanted[at] - position > gap:
                    position = wanted[at]
                    consumer.assign([TopicPartition(topic, partition, position)])
                for msg in consumer.consume(POLL_BATCH, 0.2):
                    offset = msg.offset()
                    if msg.error() or offset is None or offset < position:
                        continue
                    position = offset + 1
                    while at < len(wanted) and wanted[at] <= offset:
                        if wanted[at] == offset:
                            out[offset] = msg
                        at += 1
                    if at < len(wanted) and wanted[at] - position > gap:
                        position = -1  # the rest of this fetch is of no use: jump
                        break
            return out

    def first_offset(self, topic: str, partition: int) -> int:
        """The first offset retention left in one partition."""
        return self._watermarks(topic, partition)[0]

    def end_offset(self, topic: str, partition: int) -> int:
        """The offset the next record written to one partition will get."""
        return self._watermarks(topic, partition)[1]

    def _watermarks(self, topic: str, partition: int) -> tuple[int, int]:
        with self._borrowed() as consumer:
            deadline = time.monotonic() + WATERMARK_TIMEOUT_S
            tp = TopicPartition(topic, partition)
            return watermarks(consumer, tp, deadline, wait_for_missing=False)

    def existing(self, topics: Sequence[str], timeout_s: float = 10.0) -> set[str]:
        """Which of ``topics`` exist now, in one request naming them: every runner asks at
        its start (a thousand at a worker's start), and the whole cluster's metadata
        (thousands of partitions with many subscriptions) is far more than these names."""
        return existing_topics(self._admin_client(), topics, timeout_s)

    def _admin_client(self) -> AdminClient:
        """The reader's admin client, made at its first use, once: runners ask from many
        threads at once, and a second client made meanwhile replaced the first, whose
        requests in flight then failed ("Handle is terminating") and failed their runners."""
        with self._admin_made:
            if self._admin is None:
                self._admin = AdminClient(dict(self._client_config), logger=log)
            return self._admin

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
        a partition is in produce order, so that record is the oldest one undelivered.
        A topic that does not exist holds nothing (a subscription's retry tiers and DLQ,
        until its first copy there: docs/decisions/0014-no-topics-until-a-failure.md)."""
        found = self.existing(list(topics), timeout_s)
        out: list[Backlog] = [
            Backlog(topic, p, 0, 0)
            for topic, count in topics.items()
            if topic not in found
            for p in range(count)
        ]
        consumer = Consumer({**self._config, "group.id": group}, logger=log)
        try:
            partitions = [
                TopicPartition(topic, p)
                for topic, count in topics.items()
                if topic in found
                for p in range(count)
            ]
            deadline = time.monotonic() + timeout_s
            # A new subscription's consumer group has no coordinator at first
            for tp in committed(consumer, partitions, deadline):
                # The topics exist, maybe only just (not on every broker yet)
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
    (:class:`state.dead_letter_ops.DeadLetterLog`)."""

    def __init__(self, reader: KafkaReader, topic: str) -> None:
        self._reader = reader
        self._topic = topic

    async def read(self, partition: int, start: int, budget: int) -> tuple[list[Record], int, bool]:
        """A DLQ that does not exist reads as empty: it is made at the subscription's first
        copy there (docs/decisions/0014-no-topics-until-a-failure.md)."""
        try:
            messages, position, end = await asyncio.to_thread(
                self._reader.read, self._topic, partition, start, budget
            )
        except KafkaException as exc:
            if exc.args[0].code() not in _MISSING:
                raise
            if await asyncio.to_thread(self._reader.existing, [self._topic]):
                raise  # it exists: the broker answered before it knew of it
            return [], start, True
        records = []
        for msg in messages:
            try:
                records.append(record_of(DLQ, msg))
            except ValueError:
                continue  # not a Setu record
        return records, position, end
