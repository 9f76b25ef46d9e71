"""What a subscription runner is built from (the composition root, ``delivery/worker.py``,
makes them; tests give stubs): its settings, and the ports to the consumer, the copy writer
and the stores."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar, runtime_checkable

from confluent_kafka import Consumer

from delivery.events import EventSink
from delivery.kafka_io import RebalanceListener
from delivery.pace import CommitPace
from delivery.ticker import Ticker
from delivery.watch import StateWatch
from delivery.webhook import WebhookSender
from setu.envelope import KafkaHeaders
from setu.limits import DEFAULT_MAX_MESSAGE_BYTES, MessageLimits
from setu.replay import WRITE_SLACK_MS
from state.attempt_log import AttemptLog
from state.delivery_budget import DeliveryBudget
from state.groups import GroupStore
from state.kafka_reader import KafkaReader
from state.replays import ReplayStore
from state.schedule_cancels import ScheduleCancels
from state.workers import WorkerReports

T = TypeVar("T")

# A seek librdkafka refused is tried again after this long, doubling (delivery/flow.py).
SEEK_RETRY_S = 0.05


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
    # How long after a replay's window the main log may still hold its messages
    # (SETU_REPLAY_SETTLE_MS, docs/replays.md).
    replay_settle_ms: int = WRITE_SLACK_MS


class Switch(Protocol):
    """Set or cleared (``threading.Event`` is one)."""

    def set(self) -> None: ...

    def clear(self) -> None: ...

    def is_set(self) -> bool: ...


class ConsumerPort(Protocol):
    """The runner's consumer: :class:`delivery.kafka_io.ConsumerThread`, or its view of the
    worker's shared readers (:class:`delivery.views.SubscriptionView`, decision 0011)."""

    @property
    def flowing(self) -> Switch: ...

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


@runtime_checkable
class CopyAware(Protocol):
    """A consumer that wants to know where its runner wrote copies: the shared tiers reader
    does not fetch a tier partition with nothing to read until then (delivery/views.py)."""

    def copied(self, topic: str, partition: int) -> None: ...


class AnnouncedCopies:
    """A :class:`CopyWriter` that tells ``consumer`` where each send wrote, also when it
    failed part-way (some copies may be there)."""

    def __init__(self, copies: CopyWriter, consumer: CopyAware) -> None:
        self._copies = copies
        self._consumer = consumer

    async def send(
        self,
        topic: str,
        partition: int,
        records: Sequence[tuple[bytes, bytes | None, KafkaHeaders]],
    ) -> list[int]:
        try:
            return await self._copies.send(topic, partition, records)
        finally:
            self._consumer.copied(topic, partition)


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
    # The worker's one look at Redis a second (delivery/watch.py); None: the runner asks on
    # its own every tick.
    watch: StateWatch | None = None
    # The worker's one timer for every runner's periodic work (delivery/ticker.py); None: the
    # runner has one of its own.
    ticker: Ticker | None = None
    # Makes the subscription's own Kafka topics where missing, before anything reads or writes
    # them (delivery/worker.py), and answers which of its retry tiers and DLQ it left to
    # ``make_topics`` (delivery/own_topics.py; None: none); None: they exist.
    prepare: Callable[[], Awaitable[Collection[str] | None]] | None = None
    # Makes the subscription's retry tiers and DLQ: at its first copy to one that is missing.
    make_topics: Callable[[], Awaitable[None]] | None = None
    # Where replays keep their progress (state.replays, delivery/replaying.py); None: this
    # worker carries out no replay.
    replays: ReplayStore | None = None
    # Producers' cancels of scheduled messages (docs/scheduling.md); None: none are made.
    cancels: ScheduleCancels | None = None
    # The worker's pace of periodic commits (delivery/pace.py); None: not paced.
    commit_pace: CommitPace | None = None


class Background:
    """Housekeeping that nothing waits for (trims, a shared breaker's closing), run as tasks
    kept referenced until they end."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[None]] = set()

    def __call__(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
