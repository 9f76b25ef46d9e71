"""Operational events (docs/policies.md §4): what workers tell a project's notification
endpoint, and how it gets there.

- :class:`EventSink` takes events from the runners (a plain append on the event loop, never
  waiting) and writes them to the events' stream (:mod:`state.event_stream`) as they
  come. Dead letters are counted per subscription and written as one
  ``message.dead_lettered`` event per :data:`DEAD_LETTER_BATCH_S` (a count and the first
  :data:`DEAD_LETTER_SAMPLE` message ids), so a failing endpoint cannot flood the operator.
- :class:`Notifier` (one per ``setu deliver`` process, members of one consumer group on the
  stream) sends each event to its project's endpoint, signed like a delivery. An event is
  acknowledged in the stream only after a 2xx, or when its project wants no such event; one
  that failed is claimed again after a back-off (5 s doubling to 10 min) by whichever
  notifier is alive, up to :data:`MAX_EVENT_ATTEMPTS` calls, then dropped with an error log.
  So events are delivered at least once (``webhook-id`` is the event's id, to de-duplicate),
  and a slow or dead notification endpoint holds nothing but the notifier back.
- Redis may forget the stream, and with it every pending event. Each notifier keeps in memory
  the events whose call failed and that it has not finished (up to :data:`MAX_HELD`), and when
  :meth:`RedisEventStream.join` says the stream was forgotten it writes them again, as new
  entries whose calls count from one. An event two notifiers both held (claimed from one by
  the other) may then come twice, under its one ``webhook-id``.

An event written to the sink is in memory until the stream takes it (at once, unless Redis is
away): a worker that crashes in between loses it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from redis.exceptions import RedisError

from delivery.egress import DIRECT, Route
from delivery.http import HttpClient, HttpError, RefusedAddress, Target, UnsafeRequest
from setu.clock import now_ms
from setu.model import Notifications
from setu.signing import signing_key, webhook_headers
from state.event_stream import RedisEventStream

log = logging.getLogger(__name__)

DEAD_LETTER_BATCH_S = 10.0
DEAD_LETTER_SAMPLE = 20
# Events the sink holds while Redis does not take them; beyond, the oldest are dropped.
MAX_HELD = 10_000
MAX_EVENT_ATTEMPTS = 15
FIRST_RETRY_MS = 5_000
MAX_RETRY_MS = 600_000
CALL_TIMEOUT_S = 10.0
CONFIG_REFRESH_S = 5.0


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
    rewritten: int = 0  # unfinished events written again after Redis forgot the stream


class EventSink:
    """Where runners put events; :meth:`run` writes them to the stream."""

    def __init__(self, stream: RedisEventStream, counts: EventCounts | None = None) -> None:
        self._stream = stream
        self.counts = counts or EventCounts()
        self._held: deque[bytes] = deque()
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
        self._held.append(orjson.dumps(event))
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
        try:
            await self._stream.append(batch)
        except (RedisError, OSError) as exc:
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


class Notifier:
    """Sends the stream's events to the projects' endpoints (see the module doc)."""

    def __init__(
        self,
        stream: RedisEventStream,
        configs: Callable[[], Awaitable[Sequence[Notifications]]],
        http: HttpClient,
        consumer: str,
        counts: EventCounts | None = None,
        route: Route = DIRECT,
    ) -> None:
        """``route``: how the calls leave (the default egress proxy, docs/security.md §4)."""
        self._stream = stream
        self._configs = configs
        self._http = http
        self._route = route
        self._consumer = consumer
        self.counts = counts or EventCounts()
        self._by_project: dict[str, Notifications] = {}
        self._configs_at = -CONFIG_REFRESH_S
        # Events whose call failed and that are not finished: event id -> encoded event,
        # written again if Redis forgets the stream (see the module doc).
        self._unfinished: dict[str, bytes] = {}

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                if await self._stream.join():
                    await self._rewrite_unfinished()
                await self._refresh_configs()
                await self._retry_due()
                entries = await self._stream.read_new(self._consumer, count=50, block_ms=1000)
                await asyncio.gather(*(self._send(i, f, 1) for i, f in entries))
            except (RedisError, OSError) as exc:
                log.warning("notifier: %s", exc)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 1.0)

    async def _rewrite_unfinished(self) -> None:
        """Redis forgot the stream: the events this notifier had not finished go in again."""
        if not self._unfinished:
            return
        events = list(self._unfinished.values())
        await self._stream.append(events)
        self._unfinished.clear()
        self.counts.rewritten += len(events)
        log.warning(
            "notifier: Redis forgot the events' stream; %d events not yet delivered written again",
            len(events),
        )

    async def _refresh_configs(self) -> None:
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

    async def _retry_due(self) -> None:
        """Claims failed events whose back-off has passed, and sends them again."""
        due = await self._stream.claim_due(self._consumer, FIRST_RETRY_MS, retry_after_ms)
        for entry_id, fields, deliveries in due:
            await self._send(entry_id, fields, deliveries + 1)

    async def _send(self, entry_id: bytes, fields: dict[bytes, bytes] | None, attempt: int) -> None:
        raw = (fields or {}).get(b"e")
        event = orjson.loads(raw) if raw else None
        target = None if event is None else self._by_project.get(str(event.get("project")))
        if event is None or target is None or event.get("type") not in target.events:
            self.counts.skipped += 1
            await self._finish(entry_id, event)
            return
        assert raw is not None
        error = await self._call(target, event["id"], raw)
        if error is None:
            self.counts.sent += 1
            await self._finish(entry_id, event)
            return
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
            await self._finish(entry_id, event)
            return
        self._hold(str(event["id"]), raw)
        log.warning(
            "notifier: event %s for project %s not delivered (call %d): %s; tried again in %d s",
            event["id"],
            target.project,
            attempt,
            error,
            retry_after_ms(attempt) // 1000,
        )

    def _hold(self, event_id: str, raw: bytes) -> None:
        self._unfinished.pop(event_id, None)  # newest last: the oldest go first when full
        if len(self._unfinished) >= MAX_HELD:
            del self._unfinished[next(iter(self._unfinished))]
        self._unfinished[event_id] = raw

    async def _finish(self, entry_id: bytes, event: dict[str, Any] | None) -> None:
        if event is not None:
            self._unfinished.pop(str(event.get("id")), None)
        await self._stream.ack(entry_id)

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
