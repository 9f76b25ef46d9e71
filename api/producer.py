"""A Kafka producer whose sends complete only when the broker has acknowledged the write.

One ``confluent_kafka.Producer`` is shared by every request (``acks=all``, idempotent,
the Java client's partitioner: setu/producer_settings.py). The
event loop polls it (``poll(0)``, which never blocks) every millisecond while records wait
for their delivery reports, and rests while none do; the reports of one poll resolve the
futures that requests await, and each streaming receiver hears of its reports once per poll.
``produce()`` itself only enqueues, so the event loop never blocks on Kafka. (A poll thread
cost a GIL hand-over per report; measured in docs/streaming.md, "Throughput, and what a
message costs".)

Contract:

- :meth:`AckedProducer.send` returns only after the broker acknowledged the record, else raises
  DependencyUnavailable (Kafka error, or no report within the ack timeout: the record may or may
  not have been written, which is what a non-2xx means to a producer). The ack timeout is
  librdkafka's ``message.timeout.ms``, which reports every record by then; a sweeper task
  fails whatever is still waiting a little later, in case a report never comes.
- :meth:`AckedProducer.send_many` enqueues every record, waits for all reports, and returns one
  error string (or None) per record, in order.
- :meth:`AckedProducer.submit` enqueues one record and returns; its report reaches a
  :class:`Reports` object later (streaming produce, which counts its own outstanding writes).
- A full local queue (BufferError) is waited out in 5 ms steps until the ack deadline, then
  reported as DependencyUnavailable: back-pressure first, refusal only when Kafka keeps up
  with nothing for a whole timeout.
- After a fatal error (possible with idempotence) the poller replaces the librdkafka
  instance; records it still held are reported as failed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from setu.envelope import KafkaHeaders
from setu.errors import DependencyUnavailable, PayloadTooLarge
from setu.limits import MessageLimits
from setu.producer_settings import durable_producer

log = logging.getLogger(__name__)

Record = tuple[bytes, bytes, KafkaHeaders]
"""key, value, headers"""

_NO_ACK = "no acknowledgement from Kafka in time"
_QUEUE_FULL = "Kafka producer queue stayed full"
_QUEUE_FULL_WAIT_S = 0.005
# The poller's rest while no record waits for its report, and its round while some do.
_POLL_S = 0.05
_POLL_BUSY_S = 0.001
# librdkafka reports every record within message.timeout.ms; this margin only guards against
# a report that never comes (e.g. a record stranded in a replaced instance).
_ACK_MARGIN_S = 2.0
_SWEEP_S = 0.25


def api_producer_config(
    bootstrap: str,
    *,
    ack_timeout_ms: int,
    max_message_bytes: int,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """librdkafka settings of the API's producer (docs/design.md §1, §3)."""
    return {
        **durable_producer(bootstrap),
        "linger.ms": 2,
        "compression.type": "lz4",
        "message.timeout.ms": ack_timeout_ms,
        # Whatever the API accepts fits (setu.limits), headers and all.
        "message.max.bytes": MessageLimits(max_message_bytes).request_bytes,
        **(extra or {}),
    }


class Reports:
    """Receives the reports of records written with :meth:`AckedProducer.submit`, on the event
    loop: ``settle(index, error)`` once per record, ``error`` None when Kafka acknowledged it."""

    def settle(self, index: int, error: str | None) -> None:
        raise NotImplementedError

    def settled(self) -> None:
        """Called once after each hand-over of reports that settled at least one of this
        receiver's records: the moment to act on all of them at once (streaming answers
        them in one ACK, docs/streaming.md "Acknowledgements")."""


class _Batch(Reports):
    """Reports of one send_many call; touched only on the event loop."""

    __slots__ = ("acked", "errors", "future", "sealed", "sent")

    def __init__(self, size: int, future: asyncio.Future[None]) -> None:
        # Every record counts as failed until its report says otherwise.
        self.errors: list[str | None] = [_NO_ACK] * size
        self.future = future
        self.sent = 0
        self.acked = 0
        self.sealed = False

    def settle(self, index: int, error: str | None) -> None:
        self.errors[index] = error
        self.acked += 1
        self.finish_if_complete()

    def finish_if_complete(self) -> None:
        if self.sealed and self.acked >= self.sent and not self.future.done():
            self.future.set_result(None)


def _expire(target: asyncio.Future[Any] | _Batch) -> None:
    """Gives up on a send whose reports did not all come in time."""
    if isinstance(target, _Batch):
        if not target.future.done():
            target.future.set_result(None)  # unreported records keep their error
    elif not target.done():
        target.set_result(_NO_ACK)


def _settle_all(reports: list[tuple[Any, int, str | None]]) -> None:
    touched: dict[Reports, None] = {}
    for target, index, error in reports:
        if isinstance(target, Reports):
            target.settle(index, error)
            touched[target] = None
        elif not target.done():
            target.set_result(error)
    for receiver in touched:
        receiver.settled()


def _produce_error(exc: KafkaException) -> Exception:
    error = exc.args[0] if exc.args else None
    if isinstance(error, KafkaError) and error.code() == KafkaError.MSG_SIZE_TOO_LARGE:
        return PayloadTooLarge(f"record too large for Kafka: {error.str()}")
    return DependencyUnavailable(f"Kafka refused the record: {exc}")


class AckedProducer:
    """The shared producer; :meth:`start` on the event loop before the first send."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        # librdkafka's own log lines go through Python logging, served by the poll thread.
        self._config = {**config, "error_cb": self._on_error, "logger": log}
        self._ack_timeout_s = int(config.get("message.timeout.ms", 30_000)) / 1000 + _ACK_MARGIN_S
        self._producer = Producer(self._config)
        self._reports: list[tuple[Any, int, str | None]] = []
        self._fatal: KafkaError | None = None
        self._stopped = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._next_poll: asyncio.TimerHandle | None = None
        self._resting = False
        # Waiting sends by deadline slot (loop time / _SWEEP_S); a send leaves its slot when it
        # completes, so only live waiters are held.
        self._waiting: dict[int, set[Any]] = {}
        self._sweeper: asyncio.Task[None] | None = None
        self.last_error: str | None = None

    def __len__(self) -> int:
        """Records enqueued and not yet reported."""
        return len(self._producer)

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._schedule_poll(_POLL_S)
        self._sweeper = self._loop.create_task(self._sweep_forever())

    async def close(self, timeout_s: float = 10.0) -> None:
        """Stops polling, waits up to ``timeout_s`` for outstanding reports, resolves them."""
        self._stopped = True
        if self._next_poll is not None:
            self._next_poll.cancel()
        if self._sweeper is not None:
            self._sweeper.cancel()
        await asyncio.to_thread(self._producer.flush, timeout_s)
        reports, self._reports = self._reports, []
        _settle_all(reports)

    async def send(self, topic: str, key: bytes, value: bytes, headers: KafkaHeaders) -> None:
        """Writes one record; returns once Kafka acknowledged it (see the module contract)."""
        deadline = self._running_loop().time() + self._ack_timeout_s
        future = await self._enqueue(topic, key, value, headers, deadline)
        await self._acknowledged([future], deadline)

    async def send_to(
        self,
        topic: str,
        partition: int,
        records: Sequence[tuple[bytes, bytes | None, list[tuple[str, bytes]]]],
    ) -> None:
        """Writes ``records`` (key, value or None for a tombstone, headers) in order to one
        partition; returns once Kafka acknowledged all of them, else raises
        DependencyUnavailable."""
        deadline = self._running_loop().time() + self._ack_timeout_s
        futures = [
            await self._enqueue(topic, key, value, headers, deadline, partition)
            for key, value, headers in records
        ]
        await self._acknowledged(futures, deadline)

    async def _enqueue(
        self,
        topic: str,
        key: bytes,
        value: bytes | None,
        headers: Sequence[tuple[str, bytes]],
        deadline: float,
        partition: int = -1,  # -1: the partitioner's choice (murmur2 of the key)
    ) -> asyncio.Future[str | None]:
        """Hands one record to librdkafka, waiting while its queue is full (until
        ``deadline``); returns the future its delivery report settles."""
        loop = self._running_loop()
        future: asyncio.Future[str | None] = loop.create_future()
        while True:
            try:
                # The stubs want list[tuple[str, str | bytes | None]]; lists are invariant.
                self._producer.produce(
                    topic,
                    value,
                    key,
                    partition=partition,
                    headers=headers,  # type: ignore[arg-type]
                    on_delivery=partial(self._on_single, future),
                )
                self._wake_poller()
                return future
            except BufferError:
                if loop.time() > deadline:
                    raise DependencyUnavailable(_QUEUE_FULL) from None
                await asyncio.sleep(_QUEUE_FULL_WAIT_S)
            except KafkaException as exc:
                raise _produce_error(exc) from exc

    async def _acknowledged(
        self, futures: list[asyncio.Future[str | None]], deadline: float
    ) -> None:
        """Returns once every one of ``futures`` reported success; raises
        DependencyUnavailable for the first that did not (or timed out by ``deadline``)."""
        waiting = self._waiting_set(deadline)
        waiting.update(futures)
        try:
            errors = [await f for f in futures]
        finally:
            waiting.difference_update(futures)
        failed = [e for e in errors if e is not None]
        if failed:
            raise DependencyUnavailable(f"Kafka did not accept the record: {failed[0]}")

    async def send_many(self, topic: str, records: Sequence[Record]) -> list[str | None]:
        """Writes every record; returns per record None (acknowledged) or an error string."""
        loop = self._running_loop()
        batch = _Batch(len(records), loop.create_future())
        deadline = loop.time() + self._ack_timeout_s
        produce = self._producer.produce
        index = 0
        while index < len(records):
            key, value, headers = records[index]
            callback = partial(self._on_batch, batch, index)
            try:
                produce(topic, value, key, headers=headers, on_delivery=callback)  # type: ignore[arg-type]
            except BufferError:
                if loop.time() > deadline:
                    break
                await asyncio.sleep(_QUEUE_FULL_WAIT_S)
                continue
            except KafkaException as exc:
                batch.errors[index] = str(_produce_error(exc))
            else:
                batch.sent += 1
            index += 1
        self._wake_poller()
        for rest in range(index, len(records)):
            batch.errors[rest] = _QUEUE_FULL
        batch.sealed = True
        batch.finish_if_complete()
        waiting = self._waiting_set(deadline)
        waiting.add(batch)
        try:
            await batch.future
        finally:
            waiting.discard(batch)
        return list(batch.errors)

    async def submit(
        self,
        topic: str,
        key: bytes,
        value: bytes,
        headers: KafkaHeaders,
        reports: Reports,
        index: int,
    ) -> None:
        """Enqueues one record and returns at once; its report reaches ``reports.settle(index,
        error)`` later on the event loop. A full local queue is waited out as in :meth:`send`
        (DependencyUnavailable after the ack timeout); a record Kafka refuses outright raises
        here and is never reported."""
        loop = self._running_loop()
        deadline = loop.time() + self._ack_timeout_s
        while not self.submit_now(topic, key, value, headers, reports, index):
            if loop.time() > deadline:
                raise DependencyUnavailable(_QUEUE_FULL)
            await asyncio.sleep(_QUEUE_FULL_WAIT_S)

    def submit_now(
        self,
        topic: str,
        key: bytes,
        value: bytes,
        headers: KafkaHeaders,
        reports: Reports,
        index: int,
    ) -> bool:
        """:meth:`submit` without waiting: False (nothing enqueued) when the local queue is
        full. For callers that write many records in a row and wait only when they must."""
        callback = partial(self._on_batch, reports, index)
        try:
            self._producer.produce(topic, value, key, headers=headers, on_delivery=callback)  # type: ignore[arg-type]
        except BufferError:
            return False
        except KafkaException as exc:
            raise _produce_error(exc) from exc
        # (Never polled here: a report must not reach its receiver before this returns.)
        if self._resting:
            self._wake_poller()
        return True

    @property
    def ack_timeout_s(self) -> float:
        """By when every record has been reported, at the latest."""
        return self._ack_timeout_s

    def _waiting_set(self, deadline: float) -> set[Any]:
        slot = int(deadline / _SWEEP_S) + 1
        waiting = self._waiting.get(slot)
        if waiting is None:
            waiting = self._waiting[slot] = set()
        return waiting

    async def _sweep_forever(self) -> None:
        loop = self._running_loop()
        while True:
            await asyncio.sleep(_SWEEP_S)
            now_slot = int(loop.time() / _SWEEP_S)
            for slot in [s for s in self._waiting if s <= now_slot]:
                for target in self._waiting.pop(slot):
                    _expire(target)

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            raise RuntimeError("AckedProducer.start() was not called")
        return self._loop

    def _on_single(
        self, future: asyncio.Future[str | None], error: KafkaError | None, _: Any
    ) -> None:
        self._reports.append((future, 0, None if error is None else error.str()))

    def _on_batch(self, batch: Reports, index: int, error: KafkaError | None, _: Any) -> None:
        self._reports.append((batch, index, None if error is None else error.str()))

    def _on_error(self, error: KafkaError) -> None:
        self.last_error = error.str()
        if error.fatal():
            log.error("Kafka producer fatal error, replacing the producer: %s", error.str())
            self._fatal = error
        else:
            log.warning("Kafka producer: %s", error.str())

    def _schedule_poll(self, delay: float) -> None:
        assert self._loop is not None
        self._resting = delay > _POLL_BUSY_S
        self._next_poll = self._loop.call_later(delay, self._poll)

    def _poll(self) -> None:
        """Serves librdkafka's callbacks (reports, errors, its log) and settles the reports,
        then polls again in a millisecond while records wait for theirs, else rests until a
        record is handed in (``_wake_poller``) or ``_POLL_S`` passed."""
        if self._stopped:
            return
        try:
            if self._fatal is not None:
                self._replace()
            self._producer.poll(0)
            if self._reports:
                reports, self._reports = self._reports, []
                _settle_all(reports)
        except Exception:
            # Whatever failed, the poller goes on: every later request depends on it.
            log.exception("Kafka producer: serving its reports failed")
        finally:
            self._schedule_poll(_POLL_BUSY_S if len(self._producer) else _POLL_S)

    def _wake_poller(self) -> None:
        """A record was handed in while the poller rested: its report is polled for soon."""
        if self._resting and not self._stopped and self._next_poll is not None:
            self._next_poll.cancel()
            self._schedule_poll(_POLL_BUSY_S)

    def _replace(self) -> None:
        old = self._producer
        self._producer = Producer(self._config)
        self._fatal = None
        old.purge()
        old.poll(0)  # reports the purged records as failed
