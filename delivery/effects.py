"""The I/O one partition index's engine asks for (its :class:`~delivery.engine.Effects`):
webhook calls through the dispatcher, copies to a tier, state writes, pauses and seeks.

A :class:`PartitionEffects` belongs to one assignment of one partition index. It works with
the subscription's shared parts (:class:`SubscriptionContext`), never with the runner: it
knows nothing of the consumer's callbacks, commits or the subscription's lifecycle. Once
the partition is given up (``alive`` false) it starts nothing more; Kafka writes in progress
are awaited, or cancelled, by the runner's drain.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any

from delivery.attempts import AttemptRecorder
from delivery.autopause import AutoPause
from delivery.dispatcher import Dispatcher
from delivery.engine import Attempt, Move, PartitionEngine, Transition
from delivery.events import Emit, EventSink
from delivery.flow import PartitionFlow
from delivery.metrics import SubscriptionMetrics
from delivery.parts import CopyWriter
from delivery.scheduling import Recalls
from delivery.writer import StateWriter
from setu.clock import now_ms
from setu.ordering.groups import Kind
from setu.ordering.records import Record, copy_headers
from setu.ordering.tiers import DLQ, MAIN, tier_name
from setu.outcome import Outcome, Verdict

log = logging.getLogger(__name__)

# Copies to the DLQ that are the message's own failure (delivery/autopause.py).
DEAD_LETTERED = frozenset({Kind.HEAD, Kind.SKIP, Kind.DEAD})


@dataclass
class SubscriptionContext:
    """What every partition of one subscription on this worker shares. The runner builds it;
    ``dispatcher`` is set once the runner starts, before any partition is assigned."""

    project: str
    name: str
    topics: Mapping[int, str]  # tier -> topic
    copies: CopyWriter
    writer: StateWriter
    flow: PartitionFlow
    metrics: SubscriptionMetrics
    autopause: AutoPause
    fail: Callable[[BaseException], None]
    emit: Emit
    attempts: AttemptRecorder | None = None
    events: EventSink | None = None  # for dead letters, which the sink batches
    dispatcher: Dispatcher | None = None
    recalls: Recalls | None = None  # held heads read back (docs/scheduling.md)

    def called(self, attempt: Attempt, outcome: Outcome, seconds: float) -> None:
        """Every webhook call's outcome: counted, and recorded in the message's attempt log."""
        self.metrics.call(outcome, seconds)
        if attempt.replay is None:  # a replayed message's age says nothing of delivery's pace
            self.metrics.timed(attempt.record, attempt.number, outcome, seconds, now_ms())
        if outcome.verdict is Verdict.DELIVERED:
            self.autopause.finished(False)
        if self.attempts is not None:
            ms = seconds * 1000
            self.attempts.called(
                attempt.record, attempt.number, outcome, now_ms() - int(ms), ms, attempt.replay
            )


class PartitionEffects:
    def __init__(self, context: SubscriptionContext, partition: int) -> None:
        self.context = context
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
                self.context.fail(error)

    # Effects

    def dispatch(self, attempt: Attempt) -> None:
        dispatcher = self.context.dispatcher
        assert dispatcher is not None  # created before the consumer can assign partitions
        dispatcher.submit(self, attempt)

    def move(self, move: Move) -> None:
        self._spawn(self._move(move))

    def persist(self, transition: Transition) -> None:
        write, context = transition.write, self.context
        if context.attempts is not None and write.state is not None and transition.sources:
            rec = transition.sources[0]
            if rec.tier == MAIN and write.state.held == rec.offset and not rec.held:
                context.attempts.scheduled(rec, now_ms())  # held for its time
        if write.dead_lettered and write.state is not None:
            # Only a released head that failed for good is dead-lettered without a copy.
            context.metrics.reparked()
            context.autopause.finished(True)
            context.emit(
                "group.parked",
                {
                    "group_id": write.group,
                    "head_message_id": write.state.head,
                    "reason": write.state.reason,
                },
            )
            log.warning(
                "subscription %s/%s: group %s parked in the DLQ again on %s after %d attempts (%s)",
                context.project,
                context.name,
                write.group,
                write.state.head,
                write.state.attempts,
                write.state.reason,
            )
        context.writer.write(self, transition)

    def delivered(self, partition: int, tier: int, offset: int) -> None:
        self.context.writer.delivered(partition, tier, offset)

    def filtered(self, partition: int, record: Record) -> None:
        self.context.metrics.filtered()
        if self.context.attempts is not None:
            self.context.attempts.filtered(record, now_ms())

    def hold(self, partition: int, tier: int, offset: int, until_ms: int) -> None:
        self.context.flow.hold(self, tier, offset, until_ms)

    def seek(self, partition: int, tier: int, offset: int) -> None:
        self.context.flow.seek(self, tier, offset)

    def recall(
        self, partition: int, group: str, offset: int, record: Record | None, first: bool
    ) -> None:
        self._spawn(self._recall(group, offset, record, first))

    def unscheduled(self, partition: int, group: str, message_id: str, why: str) -> None:
        context = self.context
        context.metrics.unscheduled(why)
        log.log(
            logging.INFO if why == "cancelled" else logging.ERROR,
            "subscription %s/%s partition %d: scheduled message %s of group %s %s, not called",
            context.project,
            context.name,
            partition,
            message_id,
            group,
            why,
        )
        if context.attempts is not None:
            context.attempts.unscheduled(message_id, group, why, now_ms())

    async def _recall(self, group: str, offset: int, record: Record | None, first: bool) -> None:
        recalls = self.context.recalls
        assert recalls is not None  # set by the runner whenever a group can be held
        if record is None:
            record = await recalls.record(self.partition, offset)
        state = self.engine.states.get(group)
        head = state.head if state is not None else None
        cancelled = first and head is not None and await recalls.cancelled(head)
        if self.alive:
            self.engine.recalled(group, record, cancelled)

    # I/O

    async def _move(self, move: Move) -> None:
        context = self.context
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
        offsets = await context.copies.send(context.topics[move.target], self.partition, records)
        context.metrics.moved(tier_name(move.target), move.kind.value, len(records))
        if move.target == DLQ:
            self._dead_lettered(move)
        if context.attempts is not None:
            context.attempts.moved(move.sources, move.target, move.kind, now_ms())
        if move.target == DLQ or move.kind is Kind.LAP:
            copy = move.copies[0]
            log.log(
                logging.WARNING if move.target == DLQ else logging.INFO,
                "subscription %s/%s partition %d: %d message(s) of group %s to %s (%s): %s",
                context.project,
                context.name,
                self.partition,
                len(records),
                move.group,
                tier_name(move.target),
                move.kind.value,
                copy.envelope.failure_reason,
            )
        if self.alive:
            context.writer.write(self, self.engine.moved(move, offsets))

    def _dead_lettered(self, move: Move) -> None:
        context = self.context
        for copy in move.copies:
            if copy.kind in DEAD_LETTERED:
                context.autopause.finished(True)
                if context.events is not None:
                    context.events.dead_lettered(
                        context.project, context.name, copy.envelope.message_id
                    )
        if move.kind is Kind.HEAD and move.group is not None:
            context.emit(
                "group.parked",
                {
                    "group_id": move.group,
                    "head_message_id": move.copies[0].envelope.message_id,
                    "reason": move.copies[0].envelope.failure_reason,
                },
            )

    async def drain(self, timeout_s: float, forced: bool) -> tuple[int, bool]:
        """Lets calls and writes in progress finish; calls not yet made are dropped. A
        forced stop abandons calls in progress instead: their results are ignored and their
        records stay unfinished, so they are called again on start (same ``webhook-id``).
        Answers how many calls were abandoned, and whether work outlived ``timeout_s``."""
        self.draining = True
        abandoned = 0
        if forced:
            self.alive = False
            abandoned = self.calling
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self.tasks or self.writing or (self.calling and not forced):
            left = deadline - loop.time()
            if left <= 0:
                log.warning("partition %d: work outlived the drain", self.partition)
                for task in self.tasks:
                    task.cancel()
                return abandoned, True
            if self.tasks:
                await asyncio.wait(list(self.tasks), timeout=min(left, 0.1))
            else:
                await asyncio.sleep(0.01)
        return abandoned, False
