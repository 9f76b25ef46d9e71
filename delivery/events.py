"""Operational events (docs/policies.md §4): what workers tell a project's notification
endpoint, and how it gets there.

- :class:`EventSink` takes events from the runners (a plain append on the event loop, never
  waiting) and writes them to the events' topic in Kafka (:class:`KafkaEventLog`) as they
  come. Dead letters are counted per subscription and written as one
  ``message.dead_lettered`` event per :data:`DEAD_LETTER_BATCH_S` (a count and the first
  :data:`DEAD_LETTER_SAMPLE` message ids), so a failing endpoint cannot flood the operator.
- :class:`Notifier` (one per ``setu deliver`` process, members of one consumer group on the
  events' topic and its retry topic) sends each event to its project's endpoint, signed like a
  delivery. An event whose call failed is written to the retry topic with its count of calls
  and when to call again (5 s doubling to 10 min), and is held there in memory until then;
  after :data:`MAX_EVENT_ATTEMPTS` calls it is dropped with an error log. A partition's offset
  is committed up to its first event not yet finished (sent, unwanted, dropped or written to
  the retry topic), so a notifier that dies leaves nothing behind: whoever takes its
  partitions reads again from there. Events are delivered at least once (``webhook-id`` is
  the event's id, to de-duplicate), and a slow or dead notification endpoint holds nothing
  but the notifier back.

Kafka keeps the events as it keeps messages (replicated, acks=all): Redis forgetting
everything loses none. An event written to the sink is in memory until Kafka acknowledges it
(within milliseconds, unless Kafka is away): a worker that crashes in between loses it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from confluent_kafka import KafkaException, Message, TopicPartition

from delivery.egress import DIRECT, Route
from delivery.http import HttpClient, HttpError, RefusedAddress, Target, UnsafeRequest
from delivery.kafka_io import (
    Assignment,
    AsyncProducer,
    ConsumerThread,
    DroppedWrite,
    consumer_config,
)
from setu.clock import now_ms
from setu.limits import MessageLimits
from setu.model import Notifications
from setu.names import EVENTS_PARTITIONS, EVENTS_RETRY_TOPIC, EVENTS_TOPIC, NOTIFIER_GROUP
from setu.partitioner import partition_for
from setu.signing import signing_key, webhook_headers

log = logging.getLogger(__name__)

DEAD_LETTER_BATCH_S = 10.0
DEAD_LETTER_SAMPLE = 20
# Events the sink holds while Kafka does not take them; beyond, the oldest are dropped. The
# notifier holds as many unfinished events before it stops reading.
MAX_HELD = 10_000
MAX_EVENT_ATTEMPTS = 15
FIRST_RETRY_MS = 5_000
MAX_RETRY_MS = 600_000
CALL_TIMEOUT_S = 10.0
CONFIG_REFRESH_S = 5.0
# How often the notifier commits what it finished, and waits before writing a retry again.
COMMIT_EVERY_S = 1.0
REWRITE_WAIT_S = 1.0

# The notifier's consumer waits this long for a record between its commands (a record ends
# the wait): an idle worker's notifier wakes twice a second, not twenty times.
NOTIFIER_POLL_S = 0.5

# Headers of a record of the retry topic: calls made so far, and when to call again (epoch ms).
H_CALLS = "setu-event-calls"
H_DUE = "setu-event-due-ms"


def retry_after_ms(deliveries: int) -> int:
    """How long a failed event waits before its next call (``deliveries`` calls so far)."""
    return int(min(MAX_RETRY_MS, FIRST_RETRY_MS * 2 ** max(0, deliveries - 1)))


@dataclass
class EventCounts:
    """What the notifier did, for the worker's metrics."""

    sent: int = 0
    failed: int = 0  # calls that failed (the event is tried again)
    dropped: int = 0  # events given up after MAX_EVENT_ATTEMPTS, or lost by the sink
    skipped: int = 0  # events no endpoint wanted


class TopicsReady:
    """Makes the events' topics once (``make``, which raises when it cannot); every caller
    asks, and learns whether they exist."""

    def __init__(self, make: Callable[[], Awaitable[object]]) -> None:
        self._make = make
        self._made = False
        self._lock = asyncio.Lock()

    async def __call__(self) -> bool:
        if self._made:
            return True
        async with self._lock:
            if not self._made:
                try:
                    await self._make()
                except Exception as exc:
                    log.warning("events: their topics are not made yet: %s", exc)
                    return False
                self._made = True
        return True


def _partition_of(project: bytes) -> int:
    """A project's events share a partition (one notifier sends them): the record key's, as
    Setu's producers place every keyed record."""
    return partition_for(project, EVENTS_PARTITIONS)


class KafkaEventLog:
    """The two events' topics, written through the worker's producer (acks=all)."""

    def __init__(self, producer: AsyncProducer) -> None:
        self._producer = producer

    async def append(self, events: Sequence[tuple[str, bytes]]) -> None:
        """Writes each (project, encoded event) to the events' topic; raises unless Kafka took
        all."""
        by_partition: dict[int, list[tuple[bytes, bytes | None, list[tuple[str, bytes]]]]] = {}
        for project, raw in events:
            key = project.encode()
            by_partition.setdefault(_partition_of(key), []).append((key, raw, []))
        await asyncio.gather(
            *(self._producer.send(EVENTS_TOPIC, p, rs) for p, rs in by_partition.items())
        )

    async def retry(self, event: LoggedEvent, calls: int, due_ms: int) -> None:
        """Writes ``event`` to the retry topic: ``calls`` made, the next one at ``due_ms``."""
        headers = [(H_CALLS, str(calls).encode()), (H_DUE, str(due_ms).encode())]
        project = event.project.encode()
        await self._producer.send(
            EVENTS_RETRY_TOPIC, _partition_of(project), [(project, event.raw, headers)]
        )


@dataclass(frozen=True, slots=True)
class LoggedEvent:
    """One record of the events' topics: the encoded event, its calls so far, when it is due."""

    raw: bytes
    event: dict[str, Any] | None  # None: not an event (skipped)
    calls: int
    due_ms: int

    @property
    def project(self) -> str:
        return str((self.event or {}).get("project", ""))

    @classmethod
    def of(cls, message: Message) -> LoggedEvent:
        raw = message.value() or b""
        headers = dict(message.headers() or ())
        try:
            event = orjson.loads(raw)
        except orjson.JSONDecodeError:
            event = None
        if not isinstance(event, dict) or "id" not in event:
            event = None
        return cls(raw, event, _int(headers.get(H_CALLS)), _int(headers.get(H_DUE)))


def _int(value: bytes | str | None) -> int:
    try:
        return int(value or 0)
    except ValueError:
        return 0


class EventSink:
    """Where runners put events; :meth:`run` writes them to Kafka."""

    def __init__(
        self,
        log_: KafkaEventLog,
        ready: Callable[[], Awaitable[bool]],
        counts: EventCounts | None = None,
    ) -> None:
        self._log = log_
        self._ready = ready
        self.counts = counts or EventCounts()
        self._held: deque[tuple[str, bytes]] = deque()  # (project, encoded event)
        self._wake = asyncio.Event()
        # (project, subscription) -> [count, sample ids, first seen (monotonic s)]
        self._dead: dict[tuple[str, str], list[Any]] = {}

    def emit(self, kind: str, project: str, subscription: str, data: dict[str, Any]) -> None:
        event = {
            "id": f"evt_{uuid.uuid4().hex}",
            "type": kind,
            "at_ms": now_ms(),
            "project": project,
            "subscription": subscription,
            "data": data,
        }
        if len(self._held) >= MAX_HELD:
            self._held.popleft()
            self.counts.dropped += 1
        self._held.append((project, orjson.dumps(event)))
        self._wake.set()

    def dead_lettered(self, project: str, subscription: str, message_id: str) -> None:
        """One message dead-lettered; sent batched (see the module doc)."""
        batch = self._dead.get((project, subscription))
        if batch is None:
            batch = self._dead[(project, subscription)] = [0, [], time.monotonic()]
        batch[0] += 1
        if len(batch[1]) < DEAD_LETTER_SAMPLE:
            batch[1].append(message_id)

    def _due_batches(self, now: float, everything: bool) -> None:
        for (project, subscription), (count, sample, since) in list(self._dead.items()):
            if everything or now - since >= DEAD_LETTER_BATCH_S:
                del self._dead[(project, subscription)]
                self.emit(
                    "message.dead_lettered",
                    project,
                    subscription,
                    {"count": count, "message_ids": sample, "since_s": round(now - since, 1)},
                )

    async def run(self, stop: asyncio.Event) -> None:
        """Writes events as they come until ``stop``; then writes what is left."""
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), 1.0)
            self._wake.clear()
            self._due_batches(time.monotonic(), everything=False)
            await self._write()
        self._due_batches(time.monotonic(), everything=True)
        await self._write()

    async def _write(self) -> None:
        if not self._held:
            return
        batch = list(self._held)
        if not await self._ready():  # it logged why
            await asyncio.sleep(1.0)
            return
        try:
            await self._log.append(batch)
        except (KafkaException, DroppedWrite) as exc:
            log.warning("events: %d not written yet: %s", len(batch), exc)
            await asyncio.sleep(1.0)
            return
        for _ in batch:
            self._held.popleft()


Emit = Callable[[str, dict[str, Any]], None]
"""Tells of one operational event of a subscription: (type, data)."""


def emitter(sink: EventSink | None, project: str, subscription: str) -> Emit:
    """How a subscription's parts emit events: into ``sink``, or nowhere without one."""
    if sink is None:
        return lambda kind, data: None
    return lambda kind, data: sink.emit(kind, project, subscription, data)


def notifier_config(
    bootstrap: str,
    client_id: str,
    limits: MessageLimits,
    client_config: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The notifiers' consumer, in their one group: a subscription's consumer that waits
    longer for records (events are not latency-bound; an idle worker fetches less often)."""
    config = consumer_config(bootstrap, NOTIFIER_GROUP, client_id, limits, client_config)
    return {**config, "fetch.wait.max.ms": 500}


@dataclass(slots=True)
class _Partition:
    """What the notifier read of one assigned partition and has not finished."""

    unfinished: set[int] = field(default_factory=set)
    next: int | None = None  # past the highest offset read
    committed: int | None = None  # what was last committed
    tasks: set[asyncio.Task[None]] = field(default_factory=set)

    def position(self) -> int | None:
        """Where a reader must start so that nothing unfinished is skipped."""
        return min(self.unfinished) if self.unfinished else self.next


class Notifier:
    """Sends the events' topics' events to the projects' endpoints (see the module doc)."""

    def __init__(
        self,
        consumer_config: dict[str, Any],
        log_: KafkaEventLog,
        ready: Callable[[], Awaitable[bool]],
        configs: Callable[[], Awaitable[Sequence[Notifications]]],
        http: HttpClient,
        counts: EventCounts | None = None,
        route: Route = DIRECT,
    ) -> None:
        """``consumer_config``: the notifiers' consumer group's (delivery/kafka_io.py);
        ``route``: how the calls leave (the default egress proxy, docs/security.md §4)."""
        self._consumer_config = consumer_config
        self._log = log_
        self._ready = ready
        self._configs = configs
        self._http = http
        self._route = route
        self.counts = counts or EventCounts()
        self._by_project: dict[str, Notifications] = {}
        self._configs_at = -CONFIG_REFRESH_S
        self._configs_lock = asyncio.Lock()
        self._parts: dict[tuple[str, int], _Partition] = {}
        self._thread: ConsumerThread | None = None
        self._paused = False

    async def run(self, stop: asyncio.Event) -> None:
        """Reads and sends until ``stop``; a consumer that fails is made again."""
        while not stop.is_set():
            if not await self._ready():
                await _wait(stop, 2.0)
                continue
            thread = self._thread = ConsumerThread(
                self._consumer_config, asyncio.get_running_loop(), self, NOTIFIER_POLL_S
            )
            thread.start([EVENTS_TOPIC, EVENTS_RETRY_TOPIC])
            while not stop.is_set() and thread.running:
                await _wait(stop, COMMIT_EVERY_S)
                self._commit(thread)
            await thread.close()
            self._forget(list(self._parts))
            if not stop.is_set():
                log.warning("notifier: its consumer ended; made again")
                await _wait(stop, 1.0)

    # The consumer thread's listener (delivery/kafka_io.py), on the event loop.

    def on_batch(self, messages: list[Message]) -> None:
        loop = asyncio.get_running_loop()
        for message in messages:
            if message.error() is not None:
                log.warning("notifier: %s", message.error())
                continue
            key = (message.topic() or "", message.partition() or 0)
            part = self._parts.get(key)
            offset = message.offset() or 0
            if part is None or offset in part.unfinished:
                continue
            part.unfinished.add(offset)
            part.next = max(part.next or 0, offset + 1)
            task = loop.create_task(self._handle(part, offset, LoggedEvent.of(message)))
            part.tasks.add(task)
            task.add_done_callback(part.tasks.discard)
        self._flow()

    async def assigned(self, committed: list[TopicPartition]) -> Assignment:
        for tp in committed:
            self._parts[(tp.topic, tp.partition)] = _Partition()
        # Every partition was revoked first (the eager assignor): what is held now is of the
        # partitions kept, none so far; the new ones start flowing.
        self._paused = sum(len(p.unfinished) for p in self._parts.values()) >= MAX_HELD
        return Assignment(starts=committed, commit_now=[], paused=committed if self._paused else [])

    async def revoked(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        offsets = []
        for tp in partitions:
            part = self._parts.get((tp.topic, tp.partition))
            position = None if part is None else part.position()
            if position is not None:
                offsets.append(TopicPartition(tp.topic, tp.partition, position))
        self._forget([(tp.topic, tp.partition) for tp in partitions])
        return offsets

    def committed(self, offsets: list[TopicPartition]) -> None:
        pass

    def lost(self, partitions: list[TopicPartition]) -> None:
        self._forget([(tp.topic, tp.partition) for tp in partitions])

    def _forget(self, keys: list[tuple[str, int]]) -> None:
        """Partitions no longer this notifier's: their unfinished events are read again by
        whoever takes them."""
        for key in keys:
            part = self._parts.pop(key, None)
            for task in list(part.tasks if part is not None else ()):
                task.cancel()

    def _commit(self, thread: ConsumerThread) -> None:
        offsets = []
        for (topic, partition), part in self._parts.items():
            position = part.position()
            if position is not None and position != part.committed:
                part.committed = position
                offsets.append(TopicPartition(topic, partition, position))
        if offsets:
            thread.post(lambda consumer: consumer.commit(offsets=offsets, asynchronous=True))

    def _flow(self) -> None:
        """Stops reading while :data:`MAX_HELD` events are unfinished (they are in Kafka)."""
        held = sum(len(p.unfinished) for p in self._parts.values())
        pause = held >= MAX_HELD if not self._paused else held > MAX_HELD // 2
        if pause == self._paused or self._thread is None:
            return
        self._paused = pause
        assigned = [TopicPartition(t, p) for t, p in self._parts]
        if pause:
            log.warning("notifier: %d events not finished; reading stops until half are", held)
            self._thread.post(lambda consumer: consumer.pause(assigned))
        else:
            self._thread.post(lambda consumer: consumer.resume(assigned))

    async def _handle(self, part: _Partition, offset: int, logged: LoggedEvent) -> None:
        """Sends one event when it is due; it is finished once sent, unwanted, dropped or
        written to the retry topic."""
        try:
            wait_ms = logged.due_ms - now_ms()
            if wait_ms > 0:
                await asyncio.sleep(wait_ms / 1000)
            await self._refresh_configs()
            calls = await self._send(logged)
            while calls is not None:  # failed: tried again from the retry topic
                try:
                    await self._log.retry(logged, calls, now_ms() + retry_after_ms(calls))
                    break
                except (KafkaException, DroppedWrite) as exc:
                    log.warning("notifier: a failed event not written to be tried again: %s", exc)
                    await asyncio.sleep(REWRITE_WAIT_S)
        except Exception:  # a defect: the event must not hold its partition's offset for ever
            self.counts.dropped += 1
            log.exception("notifier: the event at offset %d dropped", offset)
        part.unfinished.discard(offset)
        self._flow()

    async def _refresh_configs(self) -> None:
        async with self._configs_lock:
            now = time.monotonic()
            if now - self._configs_at < CONFIG_REFRESH_S:
                return
            try:
                found = await self._configs()
            except Exception as exc:  # keep the last ones while the store is away
                log.warning("notifier: notification endpoints not read: %s", exc)
                return
            self._by_project = {n.project: n for n in found}
            self._configs_at = now

    async def _send(self, logged: LoggedEvent) -> int | None:
        """Calls the event's endpoint; the calls made so far when it is to be tried again,
        None when it is finished."""
        event = logged.event
        target = None if event is None else self._by_project.get(logged.project)
        if event is None or target is None or event.get("type") not in target.events:
            self.counts.skipped += 1
            return None
        attempt = logged.calls + 1
        error = await self._call(target, str(event["id"]), logged.raw)
        if error is None:
            self.counts.sent += 1
            return None
        self.counts.failed += 1
        if attempt >= MAX_EVENT_ATTEMPTS:
            self.counts.dropped += 1
            log.error(
                "notifier: event %s (%s) for project %s dropped after %d calls: %s",
                event["id"],
                event["type"],
                target.project,
                attempt,
                error,
            )
            return None
        log.warning(
            "notifier: event %s for project %s not delivered (call %d): %s; tried again in %d s",
            event["id"],
            target.project,
            attempt,
            error,
            retry_after_ms(attempt) // 1000,
        )
        return attempt

    async def _call(self, target: Notifications, event_id: str, body: bytes) -> str | None:
        """One call; None on a 2xx, else what went wrong."""
        signing = [] if target.signing_secret is None else [signing_key(target.signing_secret)]
        headers = [("content-type", "application/json")]
        headers += webhook_headers(event_id, now_ms() // 1000, body, signing)
        try:
            response = await self._http.request(
                "POST", Target.parse(target.url), headers, body, CALL_TIMEOUT_S, self._route
            )
        except (UnsafeRequest, RefusedAddress) as exc:
            return exc.reason
        except HttpError as exc:
            return exc.reason
        if 200 <= response.status < 300:
            return None
        return f"HTTP {response.status}"


async def _wait(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)
