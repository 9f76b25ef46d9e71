"""One subscription on one worker: its consumer, one engine per assigned partition index, and
the I/O each engine asks for (webhook calls, Kafka copies, Redis writes, pauses and seeks).

Lifecycle: :meth:`SubscriptionRunner.run` joins the subscription's consumer group and returns
when :meth:`stop` is called (or raises when something it cannot repair failed: the worker then
starts a new runner, which recovers from Kafka and Redis). On revocation and on stop it stops
starting calls, lets calls and writes in progress finish, flushes recorded 2xx outcomes and
commits what is safe ("flush, then commit", as quix-streams checkpoints).

Back-pressure: a tier partition with too many records in memory is paused until the engine
has worked them down; the memory a worker needs is bounded per partition, not per group.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import threading
from collections import defaultdict
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from confluent_kafka import Consumer, KafkaException, Message, TopicPartition

from delivery.attempts import FLUSH_MS, AttemptRecorder
from delivery.autopause import AutoPause
from delivery.breaker import BreakerState, BreakerView, CircuitBreaker
from delivery.dispatcher import Dispatcher
from delivery.engine import Attempt, Move, PartitionEngine, Transition
from delivery.events import EventSink
from delivery.kafka_io import Assignment, RebalanceListener, consumer_config
from delivery.metrics import DeliveryMetrics, RunnerFigures
from delivery.replays import decode_marks, encode_marks
from delivery.takeover import take_over
from delivery.webhook import WebhookSender
from delivery.writer import StateWriter
from setu import names
from setu.clock import now_ms
from setu.envelope import KafkaHeaders
from setu.limits import DEFAULT_MAX_MESSAGE_BYTES, MessageLimits
from setu.model import StopMode, Subscription, SubscriptionState
from setu.ordering.groups import Kind, Standing, standing
from setu.ordering.records import Record, copy_headers
from setu.ordering.tiers import DLQ, MAIN, tier_name, topics_by_tier
from setu.outcome import Outcome, Verdict
from state.attempt_log import AttemptLog
from state.delivery_budget import DeliveryBudget
from state.groups import GroupStore
from state.kafka_reader import KafkaReader, record_of
from state.workers import WorkerReports

T = TypeVar("T")

log = logging.getLogger(__name__)

_HOLD = "hold"
_PRESSURE = "pressure"
_PAUSED = "paused"
_FULL = "full"
# Consuming stops for at most this long when the worker is full; then partitions are paused
# instead, so the consumer keeps polling (and serving rebalances).
FULL_STOP_S = 1.0
# A seek librdkafka refused is tried again after this long, doubling up to the maximum; the
# first few failures are expected around an assignment and logged quietly.
SEEK_RETRY_S = 0.05
SEEK_RETRY_MAX_S = 1.0
SEEK_RETRIES_QUIET = 3
# How often a runner asks whether a policy pauses its subscription.
POLICY_CHECK_MS = 1000
# How often a runner renews its share of max_in_flight, and the headroom it asks for beyond
# what it wants now (state/delivery_budget.py).
SLOT_RENEW_MS = 250
SLOT_HEADROOM = 4
# How long a worker's word that its breaker is open lasts unless renewed (every policy check).
SHARED_BREAKER_TTL_MS = 5_000
# Copies to the DLQ that are the message's own failure (delivery/autopause.py).
DEAD_LETTERED = frozenset({Kind.HEAD, Kind.SKIP, Kind.DEAD})


async def cancel_all(tasks: Sequence[asyncio.Task[Any]], every_s: float = 0.5) -> None:
    """Cancels ``tasks`` and waits until all ended, cancelling again those that are not: a
    library call may swallow a cancellation (Python 3.11's ``asyncio.wait_for`` can), and a
    housekeeping loop that went back to sleep would hold the runner's stop for its interval."""
    while pending := [t for t in tasks if not t.done()]:
        for task in pending:
            task.cancel()
        await asyncio.wait(pending, timeout=every_s)
    await asyncio.gather(*tasks, return_exceptions=True)


def breaker_report(view: BreakerView) -> dict[str, Any]:
    """The breaker as a worker reports it (the API's status sums the workers' reports)."""
    return {
        "state": view.state.value,
        "since_ms": view.since_ms,
        "last_error": view.last_error,
        "outage_since_ms": view.outage_since_ms,
    }


@dataclass(frozen=True, slots=True)
class RunnerConfig:
    bootstrap: str
    worker_id: str
    # How Kafka clients reach the broker besides the bootstrap (docs/security.md §8).
    client_config: Mapping[str, str] = field(default_factory=dict)
    limits: MessageLimits = field(default_factory=lambda: MessageLimits(DEFAULT_MAX_MESSAGE_BYTES))
    commit_interval_ms: int = 1000
    release_poll_ms: int = 1000
    stats_interval_ms: int = 2000
    drain_timeout_s: float = 20.0
    # How often dead letters that retention removed are forgotten in Redis.
    dead_letter_trim_ms: int = 300_000
    # Records the subscription may hold in memory before it stops consuming (at least this,
    # and at least 8 x max_in_flight).
    max_buffered: int = 2048
    # A seek librdkafka refused is tried again after this long (doubling, see SEEK_RETRY_S).
    seek_retry_s: float = SEEK_RETRY_S
    # How long each message's attempt log is kept (SETU_ATTEMPT_LOG_HOURS); 0: not kept.
    attempt_log_hours: int = 24


class ConsumerPort(Protocol):
    """The runner's consumer (:class:`delivery.kafka_io.ConsumerThread`)."""

    flowing: threading.Event

    @property
    def done(self) -> asyncio.Future[None]: ...

    @property
    def running(self) -> bool: ...

    def start(self, topics: Sequence[str]) -> None: ...

    def post(
        self, command: Callable[[Consumer], Any], then: Callable[[], None] | None = None
    ) -> None: ...

    async def call(self, command: Callable[[Consumer], T]) -> T: ...

    async def close(self) -> None: ...


class CopyWriter(Protocol):
    """Writes copies to a tier (:class:`delivery.kafka_io.AsyncProducer`)."""

    async def send(
        self,
        topic: str,
        partition: int,
        records: Sequence[tuple[bytes, bytes | None, KafkaHeaders]],
    ) -> list[int]: ...


@dataclass(frozen=True)
class RunnerParts:
    """What one runner works with; the composition root builds them."""

    store: GroupStore
    sender: WebhookSender
    reader: KafkaReader
    copies: CopyWriter
    reports: WorkerReports  # the worker's live figures (state.workers)
    consumer: Callable[[dict[str, Any], asyncio.AbstractEventLoop, RebalanceListener], ConsumerPort]
    # Where each message's attempts are recorded (delivery/attempts.py); None: not recorded.
    attempts: AttemptLog | None = None
    # Pauses the subscription in the metadata store with a reason (docs/policies.md §3).
    pause: Callable[[str], Awaitable[None]] | None = None
    # max_in_flight shared with the subscription's other workers (docs/policies.md §5);
    # None: this worker alone keeps it.
    budget: DeliveryBudget | None = None
    # Where operational events go (delivery/events.py); None: nowhere.
    events: EventSink | None = None
    # A Kafka topic's retention in ms (None: for ever), for the expiry of failed groups'
    # messages; None: not known (not reported).
    retention: Callable[[str], Awaitable[int | None]] | None = None


class _Port:
    """The :class:`~delivery.engine.Effects` of one engine: its I/O, on the event loop."""

    def __init__(self, runner: SubscriptionRunner, partition: int) -> None:
        self.runner = runner
        self.partition = partition
        self.engine: PartitionEngine
        self.epoch = 0  # this worker's owner epoch of the partition (setu.ordering.fencing)
        self.alive = True
        self.draining = False
        self.tasks: set[asyncio.Task[None]] = set()  # Kafka writes in progress
        self.calling = 0  # webhook calls being made
        self.writing = 0  # Redis writes handed to the writer and not yet applied

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self.tasks.discard(task)
        if not task.cancelled():
            error = task.exception()
            if error is not None:
                self.runner.fail(error)

    # Effects

    def dispatch(self, attempt: Attempt) -> None:
        dispatcher = self.runner.dispatcher
        assert dispatcher is not None  # created before the consumer can assign partitions
        dispatcher.submit(self, attempt)

    def move(self, move: Move) -> None:
        self._spawn(self._move(move))

    def persist(self, transition: Transition) -> None:
        write = transition.write
        if write.dead_lettered and write.state is not None:
            # Only a released head that failed for good is dead-lettered without a copy.
            self.runner.metrics.reparked()
            self.runner.autopause.finished(True)
            self.runner.emit(
                "group.parked",
                {
                    "group_id": write.group,
                    "head_message_id": write.state.head,
                    "reason": write.state.reason,
                },
            )
            log.warning(
                "subscription %s/%s: group %s parked in the DLQ again on %s after %d attempts (%s)",
                self.runner.sub.project,
                self.runner.sub.name,
                write.group,
                write.state.head,
                write.state.attempts,
                write.state.reason,
            )
        self.runner.writer.write(self, transition)

    def delivered(self, partition: int, tier: int, offset: int) -> None:
        self.runner.writer.delivered(partition, tier, offset)

    def filtered(self, partition: int, record: Record) -> None:
        runner = self.runner
        runner.metrics.filtered()
        if runner.attempts is not None:
            runner.attempts.filtered(record, now_ms())

    def hold(self, partition: int, tier: int, offset: int, until_ms: int) -> None:
        self.runner.hold(self, tier, offset, until_ms)

    def seek(self, partition: int, tier: int, offset: int) -> None:
        self.runner.seek(self, tier, offset)

    # I/O

    async def _move(self, move: Move) -> None:
        runner = self.runner
        if not self.alive:
            return  # the partition was given up: its next owner decides again
        records = [
            (
                copy.envelope.key,
                copy.envelope.body,
                copy_headers(copy.envelope, copy.kind, copy.origin, copy.due_at_ms, self.epoch),
            )
            for copy in move.copies
        ]
        offsets = await runner.producer.send(runner.topics[move.target], self.partition, records)
        runner.metrics.moved(tier_name(move.target), move.kind.value, len(records))
        if move.target == DLQ:
            for copy in move.copies:
                if copy.kind in DEAD_LETTERED:
                    runner.autopause.finished(True)
                    if runner.events is not None:
                        runner.events.dead_lettered(
                            runner.sub.project, runner.sub.name, copy.envelope.message_id
                        )
            if move.kind is Kind.HEAD and move.group is not None:
                runner.emit(
                    "group.parked",
                    {
                        "group_id": move.group,
                        "head_message_id": move.copies[0].envelope.message_id,
                        "reason": move.copies[0].envelope.failure_reason,
                    },
                )
        if runner.attempts is not None:
            runner.attempts.moved(move.sources, move.target, move.kind, now_ms())
        if move.target == DLQ or move.kind is Kind.LAP:
            copy = move.copies[0]
            log.log(
                logging.WARNING if move.target == DLQ else logging.INFO,
                "subscription %s/%s partition %d: %d message(s) of group %s to %s (%s): %s",
                runner.sub.project,
                runner.sub.name,
                self.partition,
                len(records),
                move.group,
                tier_name(move.target),
                move.kind.value,
                copy.envelope.failure_reason,
            )
        if self.alive:
            runner.writer.write(self, self.engine.moved(move, offsets))


class SubscriptionRunner:
    """Runs ``sub`` on this worker (see the module doc)."""

    def __init__(
        self,
        sub: Subscription,
        config: RunnerConfig,
        parts: RunnerParts,
        metrics: DeliveryMetrics | None = None,
    ) -> None:
        """Built on the event loop; ``parts`` come from the process's composition root
        (:func:`delivery.worker.runner_parts`), or are stubs in tests."""
        self.sub = sub
        self.metrics = (metrics or DeliveryMetrics()).subscription(sub.project, sub.name)
        self.config = config
        self.reports = parts.reports
        self.producer = parts.copies
        self.store = parts.store
        self.sender = parts.sender
        self.attempts = (
            None
            if parts.attempts is None
            else AttemptRecorder(parts.attempts, self.metrics.attempt_log_dropped)
        )
        self.reader = parts.reader
        self._pause = parts.pause
        self.budget = parts.budget
        self.events = parts.events
        self._retention = parts.retention
        # Per standing: when the longest-unhealthy group first failed, and how long the
        # topics holding such groups' messages keep them (docs/design.md §4).
        self.oldest_failed: dict[Standing, int] = {}
        self.retention_ms: dict[Standing, int | None] | None = None
        self._pausing = False  # a policy pause is on its way to the store
        self.breaker = CircuitBreaker(
            sub.policies.circuit_breaker,
            f"subscription {sub.project}/{sub.name}",
            on_change=self._breaker_changed,
        )
        self.autopause = AutoPause(sub.policies)
        group = names.consumer_group(sub.project, sub.name)
        self._consumer = parts.consumer(
            consumer_config(
                config.bootstrap, group, config.worker_id, config.limits, config.client_config
            ),
            asyncio.get_running_loop(),
            self,
        )
        self.tiers = topics_by_tier(sub)  # topic -> tier
        self.topics = {tier: topic for topic, tier in self.tiers.items()}
        self.ports: dict[int, _Port] = {}
        self.writer = StateWriter(self.store, self.fail, self._epoch_of)
        self.gate = asyncio.Event()
        self.gate.set()
        self._reasons: dict[tuple[int, int], set[str]] = defaultdict(set)
        self._committed: dict[tuple[int, int], int] = {}
        self._stopped = asyncio.Event()
        self._fatal: BaseException | None = None
        self.dispatcher: Dispatcher | None = None
        self._housekeeping: set[asyncio.Task[None]] = set()
        self._full_since: float | None = None
        self._stop_mode = StopMode.GRACEFUL
        self._stop_request: int | None = None
        self._abandoned = 0  # calls a forced stop abandoned
        self._outlived = False  # work outlived a drain

    # Control

    async def run(self) -> None:
        """Consumes until :meth:`stop`; raises what made it give up, if anything did."""
        loop = asyncio.get_running_loop()
        await self._adopt_dropped_tiers()
        consumer = self._consumer
        self.dispatcher = Dispatcher(
            self.sender,
            self.gate,
            # With a shared budget the pool grows to this worker's share (_renew_slots).
            self.sub.max_in_flight if self.budget is None else 0,
            self.fail,
            self._called,
            breaker=self.breaker,
        )
        consumer.start(list(self.tiers))
        background: list[asyncio.Task[None]] = []
        # From here on the consumer is in its group: whatever happens, it leaves it below
        # (a runner that left it behind would hold its partitions from its successor).
        try:
            # At once, not after the first interval: a stop asked for from now on waits for
            # this worker's confirmation (api/subscriptions.py, stop). Both are done again
            # every interval, so Redis being away at the start (a failover) stops nothing.
            await self._first(self._report, "report")
            if self.budget is not None:
                await self._first(self._renew_slots, "share of max_in_flight")
            background = [
                loop.create_task(self._every(self.config.commit_interval_ms, self.commit)),
                loop.create_task(self._every(self.config.release_poll_ms, self._poll_releases)),
                loop.create_task(self._every(self.config.stats_interval_ms, self._report)),
                loop.create_task(self._every(50, self._balance)),
                loop.create_task(
                    self._every(self.config.dead_letter_trim_ms, self._trim_dead_letters)
                ),
                loop.create_task(self._every(POLICY_CHECK_MS, self._check_policies)),
            ]
            if self.budget is not None:
                background.append(loop.create_task(self._every(SLOT_RENEW_MS, self._renew_slots)))
            if self.attempts is not None:
                background.append(loop.create_task(self._every(FLUSH_MS, self.attempts.flush)))
            stopped: asyncio.Future[Any] = loop.create_task(self._stopped.wait())
            ended: asyncio.Future[Any] = consumer.done
            await asyncio.wait([stopped, ended], return_when=asyncio.FIRST_COMPLETED)
            stopped.cancel()
            if consumer.done.done() and not self._stopped.is_set():
                error = consumer.done.exception()
                self.fail(error or RuntimeError("the consumer stopped"))
        finally:
            await cancel_all(background)
            await consumer.close()
            await self.dispatcher.close()
            if self.attempts is not None:
                await self.attempts.flush()
            await self._forget_stats()
            if self.budget is not None:
                with contextlib.suppress(Exception):  # its entry expires anyway
                    await self.budget.leave(self.config.worker_id)
            await self._confirm_stop()
        if self._fatal is not None:
            raise self._fatal

    async def _first(self, work: Callable[[], Awaitable[None]], what: str) -> None:
        try:
            await work()
        except Exception as exc:
            log.warning(
                "subscription %s/%s: first %s failed: %s",
                self.sub.project,
                self.sub.name,
                what,
                exc,
            )

    async def _confirm_stop(self) -> None:
        """Tells the API how this worker carried out an operator's stop."""
        if self._stop_request is None or not self._stopped.is_set():
            return
        record = {
            "requested_at_ms": self._stop_request,
            "mode": self._stop_mode.value,
            "stopped_at_ms": now_ms(),
            "abandoned_calls": self._abandoned,
            "drained": not self._outlived,
        }
        try:
            await self.reports.confirm_stop(
                self.sub.project, self.sub.name, self.config.worker_id, record
            )
        except Exception as exc:  # the stop happened; only its confirmation is missing
            log.warning(
                "subscription %s/%s: stop not confirmed: %s", self.sub.project, self.sub.name, exc
            )

    def _called(self, attempt: Attempt, outcome: Outcome, seconds: float) -> None:
        """Every webhook call's outcome: counted, and recorded in the message's attempt log."""
        self.metrics.call(outcome, seconds)
        self.metrics.timed(attempt.record, attempt.number, outcome, seconds, now_ms())
        if outcome.verdict is Verdict.DELIVERED:
            self.autopause.finished(False)
        if self.attempts is not None:
            ms = seconds * 1000
            self.attempts.called(attempt.record, attempt.number, outcome, now_ms() - int(ms), ms)

    def _breaker_changed(self, view: BreakerView) -> None:
        self.metrics.breaker_changed(view)
        if self.events is not None and view.state is not BreakerState.HALF_OPEN:
            kind = "opened" if view.state is BreakerState.OPEN else "closed"
            self.emit(f"endpoint.breaker_{kind}", breaker_report(view))
        if view.state is BreakerState.CLOSED and self.budget is not None:
            # A probe got through: the other workers may call again (_sync_breaker).
            self._background(self.budget.close_breaker(view.since_ms, SHARED_BREAKER_TTL_MS))

    async def _sync_breaker(self) -> None:
        """Shares the breaker with the subscription's other workers (delivery/breaker.py):
        adopts another worker's open breaker, closes when another worker's probe got
        through, carries an adopted outage on when its owner is gone, and publishes this
        worker's own open breaker while it stays open."""
        assert self.budget is not None
        breaker, rules = self.breaker, self.breaker.rules
        shared = await self.budget.shared_breaker()
        word = None if shared is None else shared.get("state")
        if rules.state is BreakerState.CLOSED:
            if shared is not None and word == BreakerState.OPEN.value:
                breaker.adopt(shared)
            return
        if word == BreakerState.CLOSED.value:
            breaker.release()  # another worker's probe got through
            return
        if rules.adopted and shared is None:
            rules.adopted = False  # its owner is gone: this worker carries the outage on
        if not rules.adopted:
            said = {**breaker_report(rules.view()), "state": BreakerState.OPEN.value}
            await self.budget.publish_breaker(said, SHARED_BREAKER_TTL_MS)

    def emit(self, kind: str, data: dict[str, Any]) -> None:
        """An operational event of this subscription (delivery/events.py)."""
        if self.events is not None:
            self.events.emit(kind, self.sub.project, self.sub.name, data)

    async def _renew_slots(self) -> None:
        """Asks for this worker's share of ``max_in_flight`` (state/delivery_budget.py): what
        it wants going, with headroom so a burst need not wait a round, and what it has."""
        assert self.budget is not None and self.dispatcher is not None
        limit = self.sub.max_in_flight
        demand = self.dispatcher.demand()
        ask = min(limit, demand + max(SLOT_HEADROOM, demand))
        busy = sum(port.calling for port in self.ports.values())
        granted = await self.budget.share(self.config.worker_id, ask, busy, limit)
        if granted != self.dispatcher.size:
            self.dispatcher.resize(granted)

    async def _check_policies(self) -> None:
        """Shares the breaker, then pauses the subscription when a policy says so
        (docs/policies.md §2, §3)."""
        if self.budget is not None:
            await self._sync_breaker()
        if self._pause is None or self._pausing or not self.gate.is_set():
            return
        reason = self.autopause.reason(self.breaker.rules.view(), now_ms())
        if reason is None:
            return
        self._pausing = True
        log.warning("subscription %s/%s: pausing: %s", self.sub.project, self.sub.name, reason)
        try:
            await self._pause(reason)
            self.emit("subscription.paused", {"reason": reason})
        except Exception as exc:  # tried again at the next check
            log.warning(
                "subscription %s/%s: pause not stored: %s", self.sub.project, self.sub.name, exc
            )
            self._pausing = False

    async def _adopt_dropped_tiers(self) -> None:
        """Also consumes retry tiers beyond the subscription's current count that still exist
        (an update removed them): their messages are delivered, or dead-lettered, not lost."""
        extra = {
            names.retry_topic(self.sub.project, self.sub.name, tier): tier
            for tier in range(self.sub.retry.tiers + 1, names.MAX_RETRY_TIERS + 1)
        }
        for topic in await asyncio.to_thread(self.reader.existing, list(extra)):
            self.tiers[topic] = extra[topic]
            self.topics[extra[topic]] = topic

    def stop(self, mode: StopMode = StopMode.GRACEFUL, requested_at_ms: int | None = None) -> None:
        """Stops the runner: ``graceful`` lets calls in progress finish (within the drain
        timeout), ``forced`` abandons them. ``requested_at_ms``: the operator's stop request
        this carries out, confirmed in Redis once stopped (docs/policies.md §6)."""
        self._stop_mode = mode
        self._stop_request = requested_at_ms
        self._stopped.set()

    def fail(self, error: BaseException) -> None:
        """Something this runner cannot repair in place: give up; the worker starts anew."""
        if self._fatal is None:
            self.metrics.failed(error)
            log.error(
                "subscription %s/%s failed: %r",
                self.sub.project,
                self.sub.name,
                error,
                exc_info=error,
            )
            self._fatal = error
        self._stopped.set()

    def set_paused(self, paused: bool) -> None:
        """Paused: no new calls and no reading; the partitions stay assigned."""
        if paused == (not self.gate.is_set()):
            return
        if paused:
            self.gate.clear()
        else:
            self.gate.set()
        for port in self.ports.values():
            for tier in self.topics:
                self._reason(port.partition, tier, _PAUSED, paused)

    def update(self, sub: Subscription) -> bool:
        """Takes a changed subscription in place when only its endpoint, limits or secret
        changed; False when the runner must be restarted for it."""

        def shape(s: Subscription) -> tuple[object, ...]:
            return (s.topic, s.grouped, s.retry, s.dead_letter_policy, s.seek_generation)

        if shape(sub) != shape(self.sub):
            return False
        if sub.state is not SubscriptionState.PAUSED:
            self._pausing = False
            if self.sub.state is SubscriptionState.PAUSED:
                self.autopause.reset()  # resumed: the window starts again
        self.breaker.update(sub.policies.circuit_breaker)
        self.autopause.update(sub.policies)
        self.sub = sub
        for port in self.ports.values():
            port.engine.sub = sub  # a new filter applies from the next record on
        self.sender.update(sub)
        if self.dispatcher is not None and self.budget is None:
            self.dispatcher.resize(sub.max_in_flight)
        self.set_paused(sub.state is SubscriptionState.PAUSED)
        return True

    # Consumer thread callbacks (on the loop)

    def on_batch(self, messages: list[Message]) -> None:
        tiers, ports = self.tiers, self.ports
        stale = sum(port.engine.stale_copies for port in ports.values())
        replays = sum(port.engine.replay_copies for port in ports.values())
        read_ms = now_ms()
        waits = self.metrics.main_wait_seconds
        for msg in messages:
            if msg.error() is not None:
                log.warning("consume error: %s", msg.error())
                continue
            tier = tiers.get(msg.topic() or "")
            port = ports.get(msg.partition() or 0)
            if tier is None or port is None:
                continue
            if tier == MAIN:
                waits.observe(max(0, read_ms - msg.timestamp()[1]) / 1000)
            try:
                rec = record_of(tier, msg, read_ms)
            except ValueError:
                log.warning("skipping a record without a message id at %s", msg.offset())
                port.engine.skip(tier, msg.offset() or 0)
                continue
            port.engine.on_record(rec)
        replays = sum(port.engine.replay_copies for port in ports.values()) - replays
        if replays > 0:
            log.info(
                "subscription %s/%s: skipped %d main-log records a replayed ingest batch "
                "wrote again",
                self.sub.project,
                self.sub.name,
                replays,
            )
        skipped = sum(port.engine.stale_copies for port in ports.values()) - stale
        if skipped > 0:
            self.metrics.stale_copies(skipped)
            log.warning(
                "subscription %s/%s: skipped %d copies written by a worker that had lost "
                "the partition",
                self.sub.project,
                self.sub.name,
                skipped,
            )
        self._regulate()

    async def assigned(self, committed: list[TopicPartition]) -> Assignment:
        by_index: dict[int, dict[int, int | None]] = defaultdict(dict)
        marks: dict[int, str | None] = {}
        for tp in committed:
            tier = self.tiers[tp.topic]
            by_index[tp.partition][tier] = tp.offset if tp.offset >= 0 else None
            if tier == MAIN and tp.offset >= 0:
                marks[tp.partition] = tp.metadata
        starts: list[TopicPartition] = []
        commit_now: list[TopicPartition] = []
        seeks: dict[int, int] = {}
        rebuilt_before = self.store.rebuilt_after_loss
        for partition, offsets in sorted(by_index.items()):
            plan = await take_over(
                self.sub, partition, offsets, self.topics, self.store, self.reader, now_ms()
            )
            port = _Port(self, partition)
            port.engine = PartitionEngine(
                self.sub,
                partition,
                port,
                plan.snapshot,
                clock=now_ms,
                rng=random.random,
                positions=plan.positions,
                epoch=plan.epoch,
                # An operator's seek asks for the main log again from an earlier offset.
                ingest_marks=None if plan.seek_generation else decode_marks(marks.get(partition)),
            )
            port.epoch = plan.epoch
            self.ports[partition] = port
            for tier in offsets:
                start = plan.starts.get(tier, -1001)  # OFFSET_INVALID: from the commit
                starts.append(TopicPartition(self.topics[tier], partition, start))
                self._committed.pop((tier, partition), None)
            if plan.seek_generation is not None:
                commit_now.append(TopicPartition(self.topics[MAIN], partition, plan.starts[MAIN]))
                seeks[partition] = plan.seek_generation
            port.engine.release_groups(plan.snapshot.release_requests)
            if not self.gate.is_set():
                for tier in offsets:
                    self._reasons[(partition, tier)].add(_PAUSED)
        log.info(
            "subscription %s/%s: took over partitions %s",
            self.sub.project,
            self.sub.name,
            sorted(by_index),
        )
        if rebuilt := self.store.rebuilt_after_loss - rebuilt_before:
            self.metrics.rebuilt(rebuilt)
            log.warning(
                "subscription %s/%s: Redis had lost the group state of %d partition(s); "
                "rebuilt from the changelog",
                self.sub.project,
                self.sub.name,
                rebuilt,
            )

        async def mark_seeks() -> None:
            for partition, generation in seeks.items():
                await self.store.mark_seek_applied(partition, generation)

        paused = [
            TopicPartition(self.topics[tier], partition)
            for (partition, tier), reasons in self._reasons.items()
            if reasons and partition in by_index
        ]
        return Assignment(starts, commit_now, mark_seeks if seeks else None, paused)

    async def revoked(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        indices = sorted({tp.partition for tp in partitions})
        ports = [self.ports[p] for p in indices if p in self.ports]
        await asyncio.gather(*(self._drain(port) for port in ports))
        with contextlib.suppress(Exception):
            await self.flush_delivered()
        offsets = []
        for port in ports:
            for tier, offset in port.engine.committable().items():
                offsets.append(self._commit_position(port, tier, offset))
            port.alive = False
            self.ports.pop(port.partition, None)
            for tier in self.topics:
                self._reasons.pop((port.partition, tier), None)
        return offsets

    def _background(self, coro: Coroutine[Any, Any, None]) -> None:
        """Housekeeping that nothing waits for; kept referenced until it ends."""
        task = asyncio.get_running_loop().create_task(coro)
        self._housekeeping.add(task)
        task.add_done_callback(self._housekeeping.discard)

    def committed(self, offsets: list[TopicPartition]) -> None:
        by_index: dict[int, dict[int, int]] = defaultdict(dict)
        for tp in offsets:
            by_index[tp.partition][self.tiers[tp.topic]] = tp.offset
        for partition, committed in by_index.items():
            self._background(self._trim(partition, committed))

    def lost(self, partitions: list[TopicPartition]) -> None:
        for partition in {tp.partition for tp in partitions}:
            port = self.ports.pop(partition, None)
            if port is not None:
                port.alive = False
                for task in port.tasks:
                    task.cancel()
        log.warning("subscription %s/%s lost partitions", self.sub.project, self.sub.name)

    # Pauses and seeks

    def post(self, command: Any, then: Any = None) -> None:
        self._consumer.post(command, then)

    def _post_for(self, port: _Port, command: Callable[[Consumer], None], then: Any = None) -> None:
        """Posts a command about ``port``'s partitions that runs only while the port is alive.
        A pause or seek posted for an assignment and run after the next one (the consumer
        thread runs commands between polls, and a rebalance happens inside a poll) would act
        on partitions their new engine knows nothing of: a pause stopping them for good, a
        seek skipping records. ``revoked`` marks the port dead before the consumer thread
        goes on to the next assignment."""

        def guarded(consumer: Consumer) -> None:
            if port.alive:
                command(consumer)

        self.post(guarded, then)

    def _reason(self, partition: int, tier: int, reason: str, on: bool) -> None:
        """Adds or removes a reason to pause one tier partition; pauses on the first and
        resumes when none is left."""
        reasons = self._reasons[(partition, tier)]
        before = bool(reasons)
        if on:
            reasons.add(reason)
        else:
            reasons.discard(reason)
        port = self.ports.get(partition)
        if before == bool(reasons) or port is None:
            return
        tp = [TopicPartition(self.topics[tier], partition)]
        if reasons:
            self._post_for(port, lambda c: c.pause(tp))
        else:
            self._post_for(port, lambda c: c.resume(tp))

    def hold(self, port: _Port, tier: int, offset: int, until_ms: int) -> None:
        """Pauses the tier partition back at ``offset`` until ``until_ms``; it is let go only
        once both the time has come and the seek has taken."""
        self._reason(port.partition, tier, _HOLD, True)
        waiting = {"seek", "time"}

        def done(what: str) -> None:
            waiting.discard(what)
            if not waiting:
                self._unhold(port, tier, offset)

        self._seek(port, tier, offset, lambda: done("seek"))
        delay = max(0.0, (until_ms - now_ms()) / 1000)
        asyncio.get_running_loop().call_later(delay, done, "time")

    def _unhold(self, port: _Port, tier: int, offset: int) -> None:
        if not port.alive:
            return
        self._reason(port.partition, tier, _HOLD, False)

        def unblocked() -> None:
            if port.alive:
                port.engine.unblocked(tier, offset)

        self.post(lambda c: None, unblocked)

    def seek(self, port: _Port, tier: int, offset: int) -> None:
        self._seek(port, tier, offset, lambda: port.engine.unblocked(tier, offset))

    def _seek(
        self, port: _Port, tier: int, offset: int, then: Callable[[], None], attempt: int = 0
    ) -> None:
        """Moves the tier partition's consumer to ``offset``, then runs ``then`` on the loop,
        between the batches fetched before the seek and those fetched after it. A seek that
        fails (librdkafka refuses it with an erroneous state while the partition's fetcher is
        still starting, e.g. just after an assignment) is tried again until it takes: the
        engine waits for it, and going on without it would skip the records in between."""
        tp = TopicPartition(self.topics[tier], port.partition, offset)
        failed: list[KafkaException] = []

        def command(consumer: Consumer) -> None:
            try:
                consumer.seek(tp)
            except KafkaException as exc:
                failed.append(exc)

        def settled() -> None:
            if not port.alive:
                return
            if not failed:
                then()
                return
            log.log(
                logging.WARNING if attempt >= SEEK_RETRIES_QUIET else logging.INFO,
                "partition %d tier %d: seek to %d failed (%s); trying again",
                port.partition,
                tier,
                offset,
                failed[0],
            )
            delay = min(self.config.seek_retry_s * 2**attempt, SEEK_RETRY_MAX_S)
            asyncio.get_running_loop().call_later(
                delay, self._seek, port, tier, offset, then, attempt + 1
            )

        self._post_for(port, command, settled)

    def _buffered(self) -> dict[tuple[int, int], int]:
        return {
            (port.partition, tier): port.engine.open_count(tier)
            for port in self.ports.values()
            for tier in self.topics
        }

    def _regulate(self) -> None:
        """Stops consuming while too many records are in memory, and starts again below 3/4.
        Stopping is cheap (nothing fetched is thrown away) but must stay short; when the
        worker stays full, its partitions are paused instead."""
        consumer = self._consumer
        limit = max(self.config.max_buffered, 8 * self.sub.max_in_flight)
        total = sum(self._buffered().values())
        loop_time = asyncio.get_running_loop().time()
        if total > limit:
            if self._full_since is None:
                self._full_since = loop_time
                consumer.flowing.clear()
            elif loop_time - self._full_since > FULL_STOP_S and consumer.flowing.is_set() is False:
                for port in self.ports.values():
                    for tier in self.topics:
                        self._reason(port.partition, tier, _FULL, True)
                consumer.flowing.set()
        elif total < limit * 3 // 4 and self._full_since is not None:
            self._full_since = None
            for port in self.ports.values():
                for tier in self.topics:
                    self._reason(port.partition, tier, _FULL, False)
            consumer.flowing.set()

    def _balance(self) -> None:
        """Back-pressure. Consuming stops and starts with the total; beyond that, with more
        than one partition index, a tier partition holding most of the budget is paused (its
        groups are slow) so the other partitions keep flowing."""
        self._regulate()
        self.writer.nudge()
        limit = max(self.config.max_buffered, 8 * self.sub.max_in_flight)
        several = len(self.ports) > 1
        for (partition, tier), count in self._buffered().items():
            held = _PRESSURE in self._reasons.get((partition, tier), ())
            if not held and several and count > limit * 3 // 4:
                self._reason(partition, tier, _PRESSURE, True)
            elif held and (count < limit // 4 or not several):
                self._reason(partition, tier, _PRESSURE, False)

    # Periodic work

    async def _every(self, interval_ms: int, work: Any) -> None:
        while not self._stopped.is_set():
            await asyncio.sleep(interval_ms / 1000)
            try:
                result = work()
                if asyncio.iscoroutine(result):
                    await result
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.fail(exc)
                return

    async def flush_delivered(self) -> None:
        """Records every 2xx reported so far (and whatever state changes go with them)."""
        await self.writer.flush()

    async def commit(self) -> None:
        """Flush, then commit what every engine says is safe, then forget older outcomes."""
        await self.flush_delivered()
        consumer = self._consumer
        if not consumer.running:
            return
        offsets: list[TopicPartition] = []
        for port in list(self.ports.values()):
            for tier, offset in port.engine.committable().items():
                if self._committed.get((tier, port.partition)) != offset:
                    offsets.append(self._commit_position(port, tier, offset))
        if not offsets:
            return
        await consumer.call(lambda c: c.commit(offsets=offsets, asynchronous=False))
        for tp in offsets:
            self._committed[(self.tiers[tp.topic], tp.partition)] = tp.offset
        self.committed(offsets)

    def _commit_position(self, port: _Port, tier: int, offset: int) -> TopicPartition:
        """What to commit for one tier partition; the main log's carries the ingest marks of
        the records below it (:mod:`delivery.replays`)."""
        topic = self.topics[tier]
        if tier != MAIN:
            return TopicPartition(topic, port.partition, offset)
        metadata = encode_marks(port.engine.ingest_marks(offset))
        return TopicPartition(topic, port.partition, offset, metadata=metadata)

    def _epoch_of(self, partition: int) -> int | None:
        """This worker's owner epoch of ``partition``; None once it is not ours."""
        port = self.ports.get(partition)
        return port.epoch if port is not None and port.alive else None

    async def _trim_dead_letters(self) -> None:
        """Forgets dead letters retention removed (housekeeping: failures are only logged)."""
        topic = self.topics[DLQ]
        for port in list(self.ports.values()):
            try:
                first = await asyncio.to_thread(self.reader.first_offset, topic, port.partition)
                await self.store.trim_dead_letters(port.partition, first)
            except Exception as exc:
                log.warning("trimming dead letters of partition %d failed: %s", port.partition, exc)

    async def _trim(self, partition: int, committed: dict[int, int]) -> None:
        try:
            await self.store.trim(partition, committed)
        except Exception as exc:  # trimming is housekeeping; the next commit trims again
            log.warning("trimming outcomes of partition %d failed: %s", partition, exc)

    async def _poll_releases(self) -> None:
        for port in list(self.ports.values()):
            groups, offsets = await self.store.poll_releases(port.partition)
            if port.alive and (groups or offsets):
                port.engine.release_groups(groups)
                port.engine.add_pending_releases(offsets)

    def figures(self) -> RunnerFigures:
        """Live figures for the worker's metrics (read at scrape time)."""
        engines = [port.engine for port in list(self.ports.values())]
        states = [s for e in engines for s in e.states.values()]
        dead = sum(1 for s in states if standing(s)[0] is Standing.DEAD_LETTERED)
        return RunnerFigures(
            project=self.sub.project,
            subscription=self.sub.name,
            partitions=len(engines),
            in_flight=sum(e.in_flight for e in engines),
            buffered=sum(e.open_count(t) for e in engines for t in self.topics),
            retry_backlog=sum(e.retry_backlog() for e in engines),
            retrying_groups=len(states) - dead,
            dead_lettered_groups=dead,
            parked=sum(s.counts[DLQ] for s in states),
            oldest_failed_ms={k.value: at for k, at in self.oldest_failed.items()},
            retention_ms={k.value: ms for k, ms in (self.retention_ms or {}).items()},
            oldest_held_ms=min(
                (at for e in engines if (at := e.oldest_held_ms()) is not None), default=None
            ),
            breaker=self.breaker.rules.state.value,
        )

    async def _report(self) -> None:
        self.oldest_failed = await self.store.oldest_unhealthy()
        if self.retention_ms is None and self._retention is not None:
            tier = self.topics[1] if self.sub.retry.tiers else self.topics[MAIN]
            self.retention_ms = {
                Standing.RETRYING: await self._retention(tier),
                Standing.DEAD_LETTERED: await self._retention(self.topics[DLQ]),
            }
        figures = {
            "in_flight": sum(p.engine.in_flight for p in self.ports.values()),
            "retry_backlog": sum(p.engine.retry_backlog() for p in self.ports.values()),
            "partitions": sorted(self.ports),
            "paused": not self.gate.is_set(),
            "breaker": breaker_report(self.breaker.rules.view()),
            "slots": None if self.dispatcher is None else self.dispatcher.size,
            "at": now_ms(),
        }
        await self.reports.report(self.sub.project, self.sub.name, self.config.worker_id, figures)

    async def _forget_stats(self) -> None:
        with contextlib.suppress(Exception):
            await self.reports.forget(self.sub.project, self.sub.name, self.config.worker_id)

    async def _drain(self, port: _Port) -> None:
        """Lets calls and writes in progress finish; calls not yet made are dropped. A
        forced stop abandons calls in progress instead: their results are ignored and their
        records stay unfinished, so they are called again on start (same ``webhook-id``)."""
        port.draining = True
        forced = self._stopped.is_set() and self._stop_mode is StopMode.FORCED
        if forced:
            port.alive = False
            self._abandoned += port.calling
        deadline = asyncio.get_running_loop().time() + self.config.drain_timeout_s
        while port.tasks or port.writing or (port.calling and not forced):
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                self._outlived = True
                log.warning("partition %d: work outlived the drain", port.partition)
                for task in port.tasks:
                    task.cancel()
                break
            if port.tasks:
                await asyncio.wait(list(port.tasks), timeout=min(left, 0.1))
            else:
                await asyncio.sleep(0.01)
