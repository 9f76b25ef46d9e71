"""``setu deliver``: runs the delivery of every subscription on this worker, or this worker's
share when several run (they join the same consumer groups and Kafka balances partitions).

Orchestration only. Every ``subscription_refresh_ms``, and at once when the API announced a
change (delivery/watch.py), the worker lists subscriptions and makes its runners match: a new
running or paused subscription gets a runner, a stopped or deleted one has its runner stopped
(partitions drained, committed and released), a changed one is updated in place or restarted,
pause and resume pause and resume dispatch. A runner that fails is started again after a
short wait. SIGTERM or SIGINT stops everything gracefully.

A Redis heartbeat key with a TTL says the worker is alive; :func:`check` reads it for
``setu deliver --check`` (Kubernetes probes).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

import redis
from redis.asyncio import Redis

from delivery.changelog import (
    EarlierChangelogs,
    keep_only,
    shared_changelogs,
    subscription_changelog,
)
from delivery.egress import Route
from delivery.events import EventSink, KafkaEventLog, Notifier, TopicsReady, notifier_config
from delivery.http import HttpClient
from delivery.kafka_io import AsyncProducer, ConsumerThread, copy_producer_config
from delivery.metrics import DeliveryMetrics, RunnerFigures
from delivery.pace import CommitPace
from delivery.parts import ConsumerPort, RunnerConfig, RunnerParts
from delivery.readers import ReaderHub, reader_config
from delivery.runner import SubscriptionRunner
from delivery.ticker import Ticker
from delivery.views import SubscriptionView
from delivery.watch import StateWatch
from delivery.webhook import WebhookSender
from setu import logs
from setu.egress import Egress
from setu.limits import MessageLimits
from setu.loop_lag import LoopLag
from setu.model import Notifications, Subscription, SubscriptionState, Topic
from setu.replay import Replay
from setu.settings import Settings
from state import workers
from state.attempt_log import RedisAttemptLog
from state.delivery_budget import RedisDeliveryBudget
from state.durable_groups import DurableGroupStore
from state.group_offsets import GroupNotEmpty, GroupOffsets
from state.groups import RedisGroupStore, announce_subscriptions
from state.kafka_admin import KafkaTopics
from state.kafka_reader import KafkaReader
from state.redis_clients import async_redis, close, sync_redis
from state.replays import ReplayStore
from state.schedule_cancels import ScheduleCancels
from state.shared_changelog import SharedChangelogs
from state.subscription_topics import SubscriptionTopics
from state.workers import RedisWorkers

log = logging.getLogger(__name__)

HEARTBEAT_INTERVAL_S = 5.0
HEARTBEAT_TTL_MS = 15_000
RESTART_DELAY_S = 2.0
STOP_TIMEOUT_S = 60.0


class SubscriptionSource(Protocol):
    """Where subscriptions come from (the metadata store, or a fixed list in tests)."""

    def list_subscriptions(self) -> list[Subscription]: ...

    def get_topic(self, project: str, name: str) -> Topic:
        """The topic a subscription reads (its partitions and retention shape the
        subscription's own Kafka topics)."""
        ...

    def pause_by_policy(self, project: str, name: str, reason: str) -> object:
        """Pauses a running subscription with ``reason`` (docs/policies.md §3)."""

    def list_notifications(self) -> list[Notifications]:
        """Every project's notification endpoint (docs/policies.md §4)."""
        ...


def worker_id(settings: Settings) -> str:
    """The heartbeat name: ``SETU_WORKER_ID``, else the host name (as the CLI's probe reads)."""
    return settings.worker_id or socket.gethostname()


def run(settings: Settings) -> None:
    """The ``setu deliver`` entry point: blocks until SIGTERM or SIGINT, then stops cleanly."""
    from state.metadata import MetadataStore
    from state.sealing import required_sealer

    logs.configure(settings.log_level)
    store = MetadataStore(settings.resolved_database_url(), required_sealer(settings.secret_key))
    try:
        _run_loop(serve(settings, store))
    finally:
        store.close()


def check(settings: Settings) -> str | None:
    """None while this machine's worker keeps its heartbeat alive, else why not
    (``setu deliver --check``)."""
    if not settings.redis_url:
        return "SETU_REDIS_URL is not set"
    client = sync_redis(settings, settings.redis_url, socket_timeout=2, socket_connect_timeout=2)
    try:
        alive = workers.is_alive(client, worker_id(settings))
    except redis.RedisError as error:
        return f"redis: {error}"
    finally:
        client.close()
    return None if alive else "no heartbeat from this machine's worker"


def _run_loop(main: object) -> None:
    try:
        import uvloop

        uvloop.run(main)  # type: ignore[arg-type]
    except ImportError:
        asyncio.run(main)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Shared:
    """What every runner of one worker process shares, made once by :func:`serve`."""

    config: RunnerConfig
    client: Redis[bytes]
    producer: AsyncProducer
    http: HttpClient
    source: SubscriptionSource
    topics: KafkaTopics
    made_topics: SubscriptionTopics
    # Group-less reads (changelogs, tails); it keeps a few consumers between them.
    reader: KafkaReader
    events: EventSink | None = None
    consumer: Callable[..., ConsumerPort] = ConsumerThread
    watch: StateWatch | None = None
    ticker: Ticker | None = None
    # The egress proxies webhook calls go through (docs/security.md §4).
    egress: Egress = field(default_factory=Egress)
    # Where replays keep their progress (docs/replays.md); None: no replays here.
    replays: ReplayStore | None = None
    # Producers' cancels of scheduled messages (docs/scheduling.md); None: none are made.
    cancels: ScheduleCancels | None = None
    # A subscription's retry tiers and DLQ are made at its first copy there, not before it
    # runs (delivery/own_topics.py): so with the shared readers.
    lazy_topics: bool = False
    # What the worker has read of its topics' shared group-state changelogs, and which
    # subscriptions still have one of their own (delivery/changelog.py).
    changelogs: SharedChangelogs | None = None
    earlier: EarlierChangelogs | None = None
    # The pace of every runner's periodic commits (delivery/pace.py); None: not paced.
    commit_pace: CommitPace | None = None

    def __post_init__(self) -> None:
        if self.changelogs is None:
            object.__setattr__(self, "changelogs", shared_changelogs(self.reader))
        if self.earlier is None:
            object.__setattr__(self, "earlier", EarlierChangelogs(self.reader))


def runner_parts(sub: Subscription, shared: Shared) -> RunnerParts:
    """The collaborators of ``sub``'s runner in a delivery process: its group store in Redis,
    its webhook sender on the shared HTTP client, the worker's reader, a consumer (or a view
    of the worker's readers), the process's producer for copies, and the call budget it
    shares with other workers."""
    client, config = shared.client, shared.config
    budget = RedisDeliveryBudget(client, sub.project, sub.name)
    assert shared.changelogs is not None and shared.earlier is not None
    changelog = subscription_changelog(sub, shared.producer, shared.changelogs, shared.earlier)
    return RunnerParts(
        store=DurableGroupStore(RedisGroupStore(client, sub.project, sub.name), changelog),
        sender=WebhookSender(sub, shared.http, shared_rate=budget.take_rate, egress=shared.egress),
        reader=shared.reader,
        copies=shared.producer,
        reports=RedisWorkers(client),
        consumer=shared.consumer,
        attempts=(
            RedisAttemptLog(client, sub.project, sub.name, config.attempt_log_hours)
            if config.attempt_log_hours > 0
            else None
        ),
        pause=partial(_pause, shared.source, client, sub.project, sub.name),
        budget=budget,
        events=shared.events,
        retention=partial(_in_thread, shared.topics.retention_ms),
        watch=shared.watch,
        ticker=shared.ticker,
        commit_pace=shared.commit_pace,
        # With shared readers a subscription's tiers and DLQ are made at its first copy
        # there (decision 0014); a consumer of its own subscribes to them by name.
        prepare=(
            partial(shared.made_topics.ensure_state, sub)
            if shared.lazy_topics
            else partial(shared.made_topics.ensure, sub)
        ),
        make_topics=partial(shared.made_topics.ensure, sub),
        replays=shared.replays,
        cancels=shared.cancels,
    )


async def _in_thread(call: Callable[[str], int | None], topic: str) -> int | None:
    return await asyncio.to_thread(call, topic)


async def _pause(
    source: SubscriptionSource, client: Redis[bytes], project: str, name: str, reason: str
) -> None:
    await asyncio.to_thread(source.pause_by_policy, project, name, reason)
    # The other workers serving it pause it within a second, not at their backstop listing.
    try:
        await announce_subscriptions(client)
    except redis.RedisError as exc:
        log.warning("could not tell the workers of %s/%s's pause: %s", project, name, exc)


async def serve(
    settings: Settings, source: SubscriptionSource, stop: asyncio.Event | None = None
) -> None:
    """Runs the worker until ``stop`` is set (or a signal arrives when ``stop`` is None)."""
    if not settings.kafka_bootstrap or not settings.redis_url:
        raise RuntimeError("SETU_KAFKA_BOOTSTRAP and SETU_REDIS_URL must be set for delivery")
    loop = asyncio.get_running_loop()
    if stop is None:
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
    name = worker_id(settings)
    instance = f"{name}:{os.getpid()}"
    client: Redis[bytes] = async_redis(settings, settings.redis_url, socket_timeout=10)
    # The runners' commands, gathered into pipelines (state/redis_clients.py, PipelinedRedis);
    # the event stream's blocking reads keep the plain client.
    runners_client: Redis[bytes] = async_redis(
        settings, settings.redis_url, pipelined=True, socket_timeout=10
    )
    limits = MessageLimits(settings.max_message_bytes)
    kafka = settings.kafka_client_config()
    producer = AsyncProducer(
        copy_producer_config(settings.kafka_bootstrap, instance, limits, kafka), loop
    )
    http = HttpClient(allow_private=settings.allow_private_endpoints)
    egress = settings.egress()
    topics = KafkaTopics(
        settings.kafka_bootstrap,
        replication_factor=settings.kafka_replication_factor,
        max_message_bytes=settings.max_message_bytes,
        client_config=kafka,
        dead_letter_retention_hours=settings.dead_letter_retention_hours,
    )
    config = RunnerConfig(
        bootstrap=settings.kafka_bootstrap,
        worker_id=instance,
        limits=limits,
        client_config=kafka,
        attempt_log_hours=settings.attempt_log_hours,
        replay_settle_ms=settings.replay_settle_ms,
    )
    reader = KafkaReader(config.bootstrap, config.client_config)
    consumer, hub = readers(settings, config, loop, reader)
    metrics = DeliveryMetrics()
    event_log = KafkaEventLog(producer)
    events_ready = TopicsReady(partial(asyncio.to_thread, topics.ensure_events))
    sink = EventSink(event_log, events_ready, metrics.events)
    notifier = Notifier(
        notifier_config(settings.kafka_bootstrap, instance, limits, kafka),
        event_log,
        events_ready,
        partial(asyncio.to_thread, source.list_notifications),
        http,
        metrics.events,
        Route(proxy=egress.default),
    )
    # Its own connection: behind the runners' commands in the shared pool, the reading went
    # stale under load and every runner then asked Redis itself (delivery/watch.py).
    watch_client: Redis[bytes] = async_redis(
        settings, settings.redis_url, max_connections=1, socket_timeout=10
    )
    watch = StateWatch(watch_client)
    events_stop = asyncio.Event()
    event_tasks = [
        loop.create_task(sink.run(events_stop)),
        loop.create_task(notifier.run(events_stop)),
        loop.create_task(watch.run(events_stop)),
        loop.create_task(LoopLag().run(events_stop)),
    ]
    pace = CommitPace(settings.delivery_commits_per_second)
    shared = Shared(
        config,
        runners_client,
        producer,
        http,
        source,
        topics,
        SubscriptionTopics(source.get_topic, topics),
        reader,
        sink,
        consumer,
        watch,
        Ticker(),
        egress,
        replays_of(source),
        getattr(source, "schedule_cancels", None),
        lazy_topics=hub is not None,
        commit_pace=pace,
    )
    worker = Worker(
        source,
        lambda sub: SubscriptionRunner(sub, config, runner_parts(sub, shared), metrics),
        watch.subscriptions_changed,
        shared.replays,
        partial(_keep_only, shared),
    )
    metrics.watch(lambda: _on_loop(loop, worker.figures))
    metrics.watch_commits(lambda: pace.waiting)
    server = None
    if settings.delivery_metrics_port is not None:
        server = metrics.serve(settings.delivery_metrics_host, settings.delivery_metrics_port)
        log.info(
            "metrics at http://%s:%d/metrics",
            settings.delivery_metrics_host,
            server.server_port,
        )
    heartbeat = loop.create_task(_heartbeat(client, name, stop))
    if hub is not None:
        hub.failed.add_done_callback(lambda _: stop.set())
    try:
        await worker.run(stop, settings.subscription_refresh_ms / 1000)
    finally:
        # After the runners: their last events are written before the sink stops.
        events_stop.set()
        await asyncio.gather(*event_tasks, return_exceptions=True)
        if server is not None:
            await asyncio.to_thread(server.shutdown)
            server.server_close()
        heartbeat.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await heartbeat
        if hub is not None:
            await hub.close()
        await producer.close()
        await asyncio.to_thread(reader.close)
        http.close()
        with contextlib.suppress(Exception):
            await RedisWorkers(client).stop_beating(name)
        await close(watch_client)
        await close(runners_client)
        await close(client)
    if hub is not None and hub.failed.done():
        raise RuntimeError("a shared reader failed") from hub.failed.result()


def _keep_only(shared: Shared, subs: list[Subscription]) -> None:
    """What the worker keeps of changelogs, only for the subscriptions it runs."""
    assert shared.changelogs is not None and shared.earlier is not None
    keep_only(subs, shared.changelogs, shared.earlier)


def replays_of(source: SubscriptionSource) -> ReplayStore | None:
    """The replays of the metadata store the subscriptions come from; None for a source
    without them (a fixed list in tests and benchmarks)."""
    replays = getattr(source, "replays", None)
    return replays if isinstance(replays, ReplayStore) else None


def readers(
    settings: Settings,
    config: RunnerConfig,
    loop: asyncio.AbstractEventLoop,
    reader: KafkaReader,
) -> tuple[Callable[..., ConsumerPort], ReaderHub | None]:
    """How runners read (``SETU_DELIVERY_READERS``): a consumer thread each, or views of one
    started :class:`ReaderHub` (decision 0011), which the caller closes."""
    if settings.delivery_readers == "per-subscription":
        return ConsumerThread, None
    hub = ReaderHub(
        lambda group: reader_config(
            config.bootstrap, group, config.worker_id, config.limits, config.client_config
        ),
        reader.first_offset,
        settings.delivery_group,
        end_offset=reader.end_offset,
    )
    hub.start(loop, config.worker_id)
    offsets = GroupOffsets(config.bootstrap, config.client_config)

    def view(
        consumer_config: dict[str, Any], loop: asyncio.AbstractEventLoop, listener: Any
    ) -> ConsumerPort:
        return SubscriptionView(consumer_config, loop, listener, hub, offsets)

    return view, hub


def _on_loop(
    loop: asyncio.AbstractEventLoop, read: Callable[[], list[RunnerFigures]]
) -> list[RunnerFigures]:
    """Runs ``read`` on the event loop (runners are the loop's) from the metrics thread."""

    async def call() -> list[RunnerFigures]:
        return read()

    try:
        return asyncio.run_coroutine_threadsafe(call(), loop).result(timeout=5)
    except Exception as exc:  # a scrape while the loop is busy or gone: no live gauges
        log.debug("metrics: live figures unavailable: %r", exc)
        return []


async def _heartbeat(client: Redis[bytes], name: str, stop: asyncio.Event) -> None:
    beats = RedisWorkers(client)
    while not stop.is_set():
        try:
            await beats.beat(name, HEARTBEAT_TTL_MS)
        except redis.RedisError as exc:
            log.warning("heartbeat: %s", exc)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), HEARTBEAT_INTERVAL_S)


async def _first_of(events: Sequence[asyncio.Event], timeout_s: float) -> None:
    """Returns when one of ``events`` is set, or after ``timeout_s``."""
    waits = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waits, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()


@dataclass(eq=False)
class _Slot:
    sub: Subscription
    runner: SubscriptionRunner
    task: asyncio.Task[None] | None = None
    retired: bool = False


class Worker:
    """Keeps one runner per running or paused subscription (see the module doc)."""

    def __init__(
        self,
        source: SubscriptionSource,
        make_runner: Callable[[Subscription], SubscriptionRunner],
        changed: asyncio.Event | None = None,
        replays: ReplayStore | None = None,
        running: Callable[[list[Subscription]], None] | None = None,
    ) -> None:
        """``replays``: where running replays are listed (docs/replays.md); None: none are
        carried out here. ``running``: told, after each reconciling, which subscriptions
        have a runner here."""
        self._running = running
        self._source = source
        self._make_runner = make_runner
        self._replays = replays
        # Set when the subscriptions changed (delivery/watch.py): list them now, not at the
        # next interval.
        self._changed = changed or asyncio.Event()
        self.slots: dict[tuple[str, str], _Slot] = {}

    def figures(self) -> list[RunnerFigures]:
        """Live figures of every runner (for metrics; on the event loop)."""
        return [slot.runner.figures() for slot in self.slots.values()]

    async def run(self, stop: asyncio.Event, refresh_s: float) -> None:
        try:
            while not stop.is_set():
                self._changed.clear()
                try:
                    subs, replays = await asyncio.to_thread(self._list)
                except Exception as exc:  # the store may be briefly away; keep what runs
                    log.warning("listing subscriptions failed: %s", exc)
                else:
                    await self.reconcile(subs, replays)
                await _first_of((stop, self._changed), refresh_s)
        finally:
            await asyncio.gather(*(self._retire(key) for key in list(self.slots)))

    def _list(self) -> tuple[list[Subscription], list[Replay] | None]:
        """The subscriptions, and the running replays (None: not known this time; a failed
        replay listing never keeps subscriptions from being served)."""
        subs = self._source.list_subscriptions()
        if self._replays is None:
            return subs, []
        try:
            return subs, self._replays.running()
        except Exception as exc:
            log.warning("listing replays failed: %s", exc)
            return subs, None

    async def reconcile(
        self, subs: list[Subscription], replays: Iterable[Replay] | None = ()
    ) -> None:
        """Runs what ``subs`` says should run; hands each runner its replays (``replays``
        None: leaves them as they were)."""
        wanted = {(s.project, s.name): s for s in subs if s.state is not SubscriptionState.STOPPED}
        stopped = {(s.project, s.name): s for s in subs if s.state is SubscriptionState.STOPPED}
        retiring = [k for k in self.slots if k not in wanted]
        # Stops run side by side: one subscription's drain does not hold up another's.
        await asyncio.gather(*(self._retire(key, stopped.get(key)) for key in retiring))
        for key, sub in wanted.items():
            slot = self.slots.get(key)
            if slot is None:
                self._launch(sub)
            elif slot.sub != sub:
                if slot.runner.update(sub):
                    slot.sub = sub
                else:
                    await self._retire(key)
                    self._launch(sub)
        if self._running is not None:
            self._running([slot.sub for slot in self.slots.values()])
        if replays is None:
            return
        running: dict[tuple[str, str], list[Replay]] = {}
        for replay in replays:
            running.setdefault((replay.project, replay.subscription), []).append(replay)
        for key, slot in self.slots.items():
            slot.runner.set_replays(running.get(key, []))

    def _launch(self, sub: Subscription) -> None:
        slot = _Slot(sub, self._make_runner(sub))
        slot.runner.set_paused(sub.state is SubscriptionState.PAUSED)
        self.slots[(sub.project, sub.name)] = slot
        slot.task = asyncio.get_running_loop().create_task(self._supervise(slot))
        log.info("running subscription %s/%s", sub.project, sub.name)

    async def _supervise(self, slot: _Slot) -> None:
        while not slot.retired:
            try:
                await slot.runner.run()
                return
            except GroupNotEmpty:
                pass  # waits for the earlier layout (logged by the runner); tried again below
            except Exception as exc:
                log.error("subscription %s/%s stopped: %r", slot.sub.project, slot.sub.name, exc)
            await asyncio.sleep(RESTART_DELAY_S)
            if not slot.retired:
                replays = slot.runner.replays()
                slot.runner = self._make_runner(slot.sub)
                slot.runner.set_paused(slot.sub.state is SubscriptionState.PAUSED)
                slot.runner.set_replays(replays)

    async def _retire(self, key: tuple[str, str], stopped: Subscription | None = None) -> None:
        """Stops a runner; ``stopped``: the subscription as an operator stopped it (how, and
        the request its runner confirms), None when it was deleted or the worker stops."""
        slot = self.slots.pop(key, None)
        if slot is None:
            return
        slot.retired = True
        if stopped is None:
            slot.runner.stop()
        else:
            slot.runner.stop(stopped.stop_mode, stopped.stop_requested_at_ms)
        if slot.task is not None:
            try:
                await asyncio.wait_for(slot.task, STOP_TIMEOUT_S)
            except (TimeoutError, asyncio.CancelledError):
                log.warning("subscription %s/%s did not stop in time", *key)
        log.info("stopped subscription %s/%s", *key)
