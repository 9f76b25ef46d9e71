"""One subscription on one worker: a small coordinator of the parts that carry it.

- a consumer (:class:`delivery.kafka_io.ConsumerThread`) reads the main log, the retry tiers
  and the DLQ; its callbacks (:meth:`SubscriptionRunner.on_batch`, ``assigned``, ``revoked``,
  ``committed``, ``lost``) land here;
- per assigned partition index, an engine (:mod:`delivery.engine`, the rules) and its effects
  (:mod:`delivery.effects`: calls, copies, state writes);
- :mod:`delivery.flow`: pauses, holds, seeks and back-pressure;
- :mod:`delivery.guards`: the circuit breaker, auto-pause and the share of ``max_in_flight``;
- :mod:`delivery.reporting`: figures, reports to the API, stop confirmations.

The runner owns their lifecycle and the commit. A new policy or background task belongs to a
part, which lists its periodic work; the runner schedules every part's alike.

Lifecycle: :meth:`SubscriptionRunner.run` joins the subscription's consumer group and returns
when :meth:`stop` is called (or raises when something it cannot repair failed: the worker then
starts a new runner, which recovers from Kafka and Redis). On revocation and on stop it stops
starting calls, lets calls and writes in progress finish, flushes recorded 2xx outcomes and
commits what is safe ("flush, then commit", as quix-streams checkpoints).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections import defaultdict
from collections.abc import Coroutine
from functools import partial
from typing import Any

from confluent_kafka import Message, TopicPartition

from delivery.attempts import FLUSH_MS, AttemptRecorder
from delivery.commits import Commits
from delivery.dispatcher import Dispatcher
from delivery.effects import PartitionEffects, SubscriptionContext
from delivery.engine import PartitionEngine
from delivery.events import emitter
from delivery.flow import PartitionFlow
from delivery.guards import SubscriptionGuards, first
from delivery.kafka_io import Assignment, consumer_config
from delivery.metrics import DeliveryMetrics, RunnerFigures
from delivery.own_topics import MadeAtFirstCopy, OwnTopics
from delivery.parts import AnnouncedCopies, Background, CopyAware, RunnerConfig, RunnerParts
from delivery.replaying import RunnerReplays
from delivery.replays import decode_marks
from delivery.reporting import RunnerReporting
from delivery.scheduling import TICK_MS as SCHEDULE_TICK_MS
from delivery.scheduling import Recalls
from delivery.takeover import Takeover, TiersMissing, take_over
from delivery.ticker import Periodic, Ticker, Ticket
from delivery.writer import StateWriter
from setu import names
from setu.clock import now_ms
from setu.model import StopMode, Subscription, SubscriptionState
from setu.ordering.tiers import MAIN, topics_by_tier
from setu.replay import Replay
from setu.together import all_or_none
from state.group_offsets import GroupNotEmpty
from state.kafka_reader import record_of

log = logging.getLogger(__name__)

# How often back-pressure is looked at (delivery/flow.py) while there is anything to look at.
BALANCE_MS = 50
# How long work with nothing to do while its runner rests waits for records (ticker.Periodic).
QUIET_REST_MS = 5000
# How often replays' lanes are started and stopped (delivery/replaying.py).
REPLAY_TICK_MS = 1000


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
        self.store = parts.store
        self.sender = parts.sender
        self.reader = parts.reader
        self.attempts = (
            None
            if parts.attempts is None
            else AttemptRecorder(parts.attempts, self.metrics.attempt_log_dropped)
        )
        emit = emitter(parts.events, sub.project, sub.name)
        self._background = Background()
        self.guards = SubscriptionGuards(
            sub,
            config.worker_id,
            self.metrics,
            emit,
            self._background,
            budget=parts.budget,
            pause=parts.pause,
        )
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
        # Its retry tiers and DLQ are made at its first copy there (delivery/own_topics.py).
        self.own = OwnTopics(parts.prepare, parts.make_topics)
        copies = MadeAtFirstCopy(parts.copies, self.own)
        self.ports: dict[int, PartitionEffects] = {}
        self.flow = PartitionFlow(
            self._consumer,
            self.topics,
            self.ports,
            lambda: max(config.max_buffered, 8 * self.guards.sub.max_in_flight),
            config.seek_retry_s,
        )
        self.writer = StateWriter(self.store, self.fail, self._epoch_of)
        self.context = SubscriptionContext(
            project=sub.project,
            name=sub.name,
            topics=self.topics,
            copies=(
                AnnouncedCopies(copies, self._consumer)
                if isinstance(self._consumer, CopyAware)
                else copies
            ),
            writer=self.writer,
            flow=self.flow,
            metrics=self.metrics,
            autopause=self.guards.autopause,
            fail=self.fail,
            emit=emit,
            attempts=self.attempts,
            events=parts.events,
            recalls=Recalls(self.reader, self.topics[MAIN], parts.cancels, sub.project, sub.topic),
        )
        self.reporting = RunnerReporting(
            sub,
            config.worker_id,
            parts.reports,
            self.store,
            self.topics,
            self.guards.breaker,
            self.metrics,
            parts.retention,
        )
        self.commits = Commits(
            self._consumer,
            self.topics,
            self.tiers,
            self.ports,
            self.writer,
            self.store,
            self.reader,
            self._background,
            parts.watch,
            present=self.own.present,
            pace=parts.commit_pace,
        )
        self.replaying = (
            None
            if parts.replays is None
            else RunnerReplays(
                self.ports, self.topics[MAIN], self.reader, parts.replays, config.replay_settle_ms
            )
        )
        self.gate = asyncio.Event()
        self.gate.set()
        self._stopped = asyncio.Event()
        # The worker's one timer for every runner's periodic work (delivery/ticker.py).
        self._ticker = parts.ticker if parts.ticker is not None else Ticker()
        self._ticket: Ticket | None = None
        # When the next held head is due, and the timer set for it (_schedule_tick).
        self._due_at: int | None = None
        self._due_timer: asyncio.TimerHandle | None = None
        self.label = f"subscription {sub.project}/{sub.name}"
        self._fatal: BaseException | None = None
        self.dispatcher: Dispatcher | None = None
        self._stop_mode = StopMode.GRACEFUL
        self._stop_request: int | None = None
        self._abandoned = 0  # calls a forced stop abandoned
        self._outlived = False  # work outlived a drain

    # Control

    async def run(self) -> None:
        """Consumes until :meth:`stop`; raises what made it give up, if anything did."""
        loop = asyncio.get_running_loop()
        await self.own.look()
        await self._adopt_dropped_tiers()
        consumer = self._consumer
        budget = self.guards.budget
        self.dispatcher = dispatcher = Dispatcher(
            self.sender,
            self.gate,
            # With a shared budget the pool grows to this worker's share (guards.renew_slots).
            self.sub.max_in_flight if budget is None else 0,
            self.fail,
            self.context.called,
            breaker=self.guards.breaker,
        )
        self.context.dispatcher = dispatcher
        self.commits.start_watching(self.sub.project, self.sub.name, self.store)
        self.guards.watched = self.commits.watched
        consumer.start(list(self.tiers))
        ticket: Ticket | None = None
        # From here on the consumer is in its group: whatever happens, it leaves it below
        # (a runner that left it behind would hold its partitions from its successor).
        try:
            # At once, not after the first interval: a stop asked for from now on waits for
            # this worker's confirmation (api/subscriptions.py, stop). Both are done again
            # every interval, so Redis being away at the start (a failover) stops nothing.
            await first(self._report_tick, "report", self.sub)
            if budget is not None:
                await first(
                    lambda: self.guards.renew_tick(dispatcher, self._busy()),
                    "share of max_in_flight",
                    self.sub,
                )
            self._ticket = ticket = self._ticker.add(self, self._periodic())
            watched = self.commits.watched
            if watched is not None:
                watched.changed = partial(self._ticker.wake, ticket)
            stopped: asyncio.Future[Any] = loop.create_task(self._stopped.wait())
            ended: asyncio.Future[Any] = consumer.done
            await asyncio.wait([stopped, ended], return_when=asyncio.FIRST_COMPLETED)
            stopped.cancel()
            if consumer.done.done() and not self._stopped.is_set():
                error = consumer.done.exception()
                self.fail(error or RuntimeError("the consumer stopped"))
        finally:
            if ticket is not None:
                await self._ticker.remove(ticket)
            if self._due_timer is not None:
                self._due_timer.cancel()
            if self.replaying is not None:
                await self.replaying.close()
            await consumer.close()
            await dispatcher.close()
            if self.attempts is not None:
                await self.attempts.flush()
            await self.reporting.forget()
            self.guards.watched = None
            self.commits.stop_watching()
            with contextlib.suppress(Exception):  # its entry expires anyway
                await self.guards.leave()
            await self._confirm_stop()
        if self._fatal is not None:
            raise self._fatal

    def _periodic(self) -> list[Periodic]:
        """Every part's periodic work: (interval in ms, work)."""
        assert self.dispatcher is not None
        work: list[Periodic] = [
            *self.commits.periodic(self.config),
            Periodic(self.config.stats_interval_ms, self._report_tick),
            *self.guards.periodic(self.dispatcher, self._busy, lambda: not self.gate.is_set()),
            # Resting, there is nothing to balance and nothing to flush: a rest of 5 s, not 1,
            # is a backstop only (records arriving wake them at once).
            Periodic(BALANCE_MS, self._balance, rests=True, rest_ms=QUIET_REST_MS),
        ]
        if self.attempts is not None:
            # Entries come from calls and records: resting, there are none to write.
            work.append(Periodic(FLUSH_MS, self.attempts.flush_tick, True, QUIET_REST_MS))
        if self.replaying is not None:
            # Resting, no lane runs; a new replay wakes the runner (set_replays).
            work.append(Periodic(REPLAY_TICK_MS, self._replay_tick, True, QUIET_REST_MS))
        # Held heads falling due (docs/scheduling.md): each is called at its time by the
        # timer this work sets, which a takeover sets too; resting, the look is a backstop.
        work.append(
            Periodic(SCHEDULE_TICK_MS, self._schedule_tick, rests=True, rest_ms=QUIET_REST_MS)
        )
        return work

    def _schedule_tick(self) -> None:
        """Wakes the engines whose held heads are due (docs/scheduling.md), and sets a timer
        for the next one: a head is called at its time, not at the next tick or rest."""
        now = now_ms()
        soonest: int | None = None
        for port in self.ports.values():
            due = port.engine.next_due_ms()
            if due is None or not port.alive:
                continue
            if due <= now:
                port.engine.wake(now)
                if self._ticket is not None:
                    # Its call ends in a commit, an attempt entry: resting works look again.
                    self._ticker.wake(self._ticket)
                due = port.engine.next_due_ms()
                if due is None:
                    continue
            soonest = due if soonest is None else min(soonest, due)
        if soonest is None or soonest == self._due_at:
            return
        if self._due_timer is not None:
            self._due_timer.cancel()
        self._due_at = soonest
        self._due_timer = asyncio.get_running_loop().call_later(
            max(0, soonest - now) / 1000, self._due
        )

    def _due(self) -> None:
        self._due_timer, self._due_at = None, None
        if not self._stopped.is_set():
            self._schedule_tick()

    def _replay_tick(self) -> None:
        if self.replaying is not None:
            self.replaying.tick(self.sub, self.dispatcher)

    def set_replays(self, replays: list[Replay]) -> None:
        """The subscription's running replays (docs/replays.md), from the worker's listing."""
        changed = self.replaying is not None and self.replaying.set(replays)
        if changed and self._ticket is not None:
            self._ticker.wake(self._ticket)

    def replays(self) -> list[Replay]:
        """What :meth:`set_replays` was last told (for a runner started in this one's place)."""
        return [] if self.replaying is None else self.replaying.replays()

    def resting(self) -> bool:
        """Nothing to do until records arrive: none in memory or held back, no call going,
        no 2xx waiting to be written, no attempt entry waiting (delivery/ticker.py)."""
        return (
            self.flow.idle()
            and not self._busy()
            and not self.writer.waiting
            and (self.attempts is None or self.attempts.empty)
            and (self.replaying is None or not self.replaying.active)
        )

    def _busy(self) -> int:
        return sum(port.calling for port in self.ports.values())

    async def _confirm_stop(self) -> None:
        if self._stop_request is None or not self._stopped.is_set():
            return
        await self.reporting.confirm_stop(
            {
                "requested_at_ms": self._stop_request,
                "mode": self._stop_mode.value,
                "stopped_at_ms": now_ms(),
                "abandoned_calls": self._abandoned,
                "drained": not self._outlived,
            }
        )

    async def _adopt_dropped_tiers(self) -> None:
        """Also consumes retry tiers beyond the subscription's current count that still exist
        (an update removed them): their messages are delivered, or dead-lettered, not lost.
        And a tier beyond its count that it has in Kafka though it does not exist yet (a
        grouped topic's tier 1, ``state.kafka_admin.held_tiers``), made at the first copy
        there."""
        extra = {
            names.retry_topic(self.sub.project, self.sub.name, tier): tier
            for tier in range(self.sub.retry.tiers + 1, names.MAX_RETRY_TIERS + 1)
        }
        found = await asyncio.to_thread(self.reader.existing, list(extra))
        for topic in found | (self.own.missing & extra.keys()):
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
        if self._fatal is None and isinstance(error, GroupNotEmpty):
            # Not a fault: during a rolling upgrade a worker of the earlier layout still
            # serves the subscription (docs/decisions/0011-shared-readers.md, "Migration").
            log.warning(
                "subscription %s/%s waits for the earlier layout's workers to leave: %s",
                self.sub.project,
                self.sub.name,
                error,
            )
            self._fatal = error
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
        self.flow.set_paused(paused)

    def update(self, sub: Subscription) -> bool:
        """Takes a changed subscription in place when only its endpoint, limits or secret
        changed; False when the runner must be restarted for it."""

        def shape(s: Subscription) -> tuple[object, ...]:
            return (s.topic, s.grouped, s.retry, s.dead_letter_policy, s.seek_generation)

        if shape(sub) != shape(self.sub):
            return False
        self.guards.update(sub)
        self.reporting.sub = sub
        self.sub = sub
        for port in self.ports.values():
            port.engine.sub = sub  # a new filter applies from the next record on
        self.sender.update(sub)
        if self.dispatcher is not None and self.guards.budget is None:
            self.dispatcher.resize(sub.max_in_flight)
        self.set_paused(sub.state is SubscriptionState.PAUSED)
        return True

    # Consumer thread callbacks (on the loop)

    def on_batch(self, messages: list[Message]) -> None:
        if self._ticket is not None:
            self._ticker.wake(self._ticket)
        tiers, ports = self.tiers, self.ports
        skipped = self.reporting.skipped_copies(ports)
        read_ms = now_ms()
        waits, ingest = self.metrics.main_wait_seconds, self.metrics.ingest_seconds
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
            produced = rec.envelope.produced_at_ms
            if tier == MAIN and produced:
                ingest.observe(max(0, msg.timestamp()[1] - produced) / 1000)
            port.engine.on_record(rec)
        self.reporting.skipped_since(skipped, ports)
        self.flow.regulate()

    async def never_owned(self, partitions: list[int]) -> bool:
        """See :class:`delivery.views.ViewListener`."""
        found = await asyncio.gather(*(self.store.never_owned(p) for p in partitions))
        return bool(found) and all(found)

    async def assigned(self, committed: list[TopicPartition]) -> Assignment:
        by_index: dict[int, dict[int, int | None]] = defaultdict(dict)
        marks: dict[int, str | None] = {}
        for tp in committed:
            tier = self.tiers[tp.topic]
            by_index[tp.partition][tier] = tp.offset if tp.offset >= 0 else None
            if tier == MAIN and tp.offset >= 0:
                marks[tp.partition] = tp.metadata
        starts: list[TopicPartition] = []
        idle: list[TopicPartition] = []
        commit_now: list[TopicPartition] = []
        seeks: dict[int, int] = {}
        rebuilt_before = self.store.rebuilt_after_loss
        # The partitions' preparations touch nothing in common (their own Redis keys,
        # changelog partitions and tails), so they run at once: each waits mostly on round
        # trips, and a worker taking over a thousand subscriptions waits on those in turn.
        indices = sorted(by_index)
        await self._look_at_own_topics(by_index)
        plans = await all_or_none(self._take_over(p, by_index[p]) for p in indices)
        for partition, plan in zip(indices, plans, strict=True):
            offsets = by_index[partition]
            port = PartitionEffects(self.context, partition)
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
                self.commits.assigned(tier, partition)
            idle.extend(TopicPartition(self.topics[tier], partition) for tier in plan.idle)
            if plan.seek_generation is not None:
                commit_now.append(TopicPartition(self.topics[MAIN], partition, plan.starts[MAIN]))
                seeks[partition] = plan.seek_generation
            port.engine.release_groups(plan.snapshot.release_requests)
            self.flow.assigned(partition, offsets, paused=not self.gate.is_set())
        log.info(
            "subscription %s/%s: took over partitions %s",
            self.sub.project,
            self.sub.name,
            sorted(by_index),
        )
        self.reporting.rebuilt(self.store.rebuilt_after_loss - rebuilt_before)
        # Heads held in the state taken over are called at their time, resting or not.
        self._schedule_tick()

        async def mark_seeks() -> None:
            for partition, generation in seeks.items():
                await self.store.mark_seek_applied(partition, generation)

        paused = self.flow.paused_at_start(by_index)
        return Assignment(starts, commit_now, mark_seeks if seeks else None, paused, idle)

    async def _look_at_own_topics(self, by_index: dict[int, dict[int, int | None]]) -> None:
        """Which of its tiers and DLQ exist before a takeover: another worker may have made
        them and copied messages there. One the group committed an offset in exists,
        whatever a broker whose metadata lags says (delivery/own_topics.py)."""
        own = self.own
        try:
            await own.look()
        except Exception as exc:
            # What it knew stays: a tier another worker made since, with messages whose
            # group state says they wait there, is made below or by the takeover
            # (TiersMissing); a copy there without such state was fenced (decision 0004).
            log.warning(
                "subscription %s/%s: which topics exist not known (%s); as before",
                self.sub.project,
                self.sub.name,
                exc,
            )
        missing = self._missing_tiers()
        if any(offsets.get(tier) is not None for offsets in by_index.values() for tier in missing):
            await own.make()

    def _missing_tiers(self) -> set[int]:
        return {self.tiers[t] for t in self.own.missing if t in self.tiers}

    async def _take_over(self, partition: int, committed: dict[int, int | None]) -> Takeover:
        def plan() -> Coroutine[Any, Any, Takeover]:
            return take_over(
                self.sub,
                partition,
                committed,
                self.topics,
                self.store,
                self.reader,
                now_ms(),
                missing=self._missing_tiers(),
            )

        try:
            return await plan()
        except TiersMissing as exc:
            log.warning("subscription %s/%s: %s; making them", self.sub.project, self.sub.name, exc)
            await self.own.make()
        return await plan()  # none missing now

    async def revoked(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        indices = sorted({tp.partition for tp in partitions})
        ports = [self.ports[p] for p in indices if p in self.ports]
        await asyncio.gather(*(self._drain(port) for port in ports))
        try:
            await self.flush_delivered()
            flushed = True
        except Exception as exc:
            # "Flush, then commit": an offset committed past records whose state changes were
            # never written would leave the next owner a group state (rebuilt from the
            # changelog) that still counts them, for records it never reads again. A long
            # crash run saw a group stuck `retrying` so. Nothing is committed instead: the
            # next owner reads them again, as after a crash.
            log.warning(
                "subscription %s/%s: state changes not written at revocation (%s); "
                "committing nothing for partitions %s",
                self.sub.project,
                self.sub.name,
                exc,
                indices,
            )
            flushed = False
        offsets = []
        for port in ports:
            if flushed:
                offsets.extend(self.commits.positions(port))
            port.alive = False
            self.ports.pop(port.partition, None)
            self.flow.forget(port.partition)
        return offsets

    def committed(self, offsets: list[TopicPartition]) -> None:
        self.commits.committed(offsets)

    def lost(self, partitions: list[TopicPartition]) -> None:
        for partition in {tp.partition for tp in partitions}:
            port = self.ports.pop(partition, None)
            if port is not None:
                port.alive = False
                for task in port.tasks:
                    task.cancel()
        log.warning("subscription %s/%s lost partitions", self.sub.project, self.sub.name)

    # Periodic work

    def _balance(self) -> None:
        self.flow.balance()
        self.writer.nudge()

    def _report_tick(self) -> Coroutine[Any, Any, None] | None:
        engines = {partition: port.engine for partition, port in self.ports.items()}
        slots = None if self.dispatcher is None else self.dispatcher.size
        return self.reporting.report_tick(engines, not self.gate.is_set(), slots)

    def figures(self) -> RunnerFigures:
        """Live figures for the worker's metrics (read at scrape time)."""
        return self.reporting.figures([port.engine for port in list(self.ports.values())])

    async def flush_delivered(self) -> None:
        """Records every 2xx reported so far (and whatever state changes go with them)."""
        await self.writer.flush()

    def _epoch_of(self, partition: int) -> int | None:
        """This worker's owner epoch of ``partition``; None once it is not ours."""
        port = self.ports.get(partition)
        return port.epoch if port is not None and port.alive else None

    async def _drain(self, port: PartitionEffects) -> None:
        forced = self._stopped.is_set() and self._stop_mode is StopMode.FORCED
        abandoned, outlived = await port.drain(self.config.drain_timeout_s, forced)
        self._abandoned += abandoned
        self._outlived = self._outlived or outlived
