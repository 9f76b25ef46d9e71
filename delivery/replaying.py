"""Replays carried out by the worker that owns each partition (docs/replays.md).

A :class:`ReplayLane` is one replay on one partition index of a subscription this worker
owns. It reads the partition's main log over the replay's window with the worker's
group-less reader (not the subscription's consumer: live delivery goes on as it was), and
calls the endpoint again with every message the replay selects and the subscription's filter
lets through, through the subscription's own call pool, so its breaker, rate limit, pause and
``max_in_flight`` hold for replayed calls too.

What it keeps:

- **Order within a group.** A group's replayed messages are called one at a time, in main-log
  order; a failed call is tried again, after the subscription's retry delays, up to the
  subscription's budget (N+1 attempts), before the group's next one. One that fails for good
  is counted and listed; under the ``park`` policy the group's later replayed messages are then
  left out (its order would break), under ``skip`` they go on.
- **Only what was delivered.** A lane reads no further than live delivery has finished the
  main log: a message not yet delivered once is not replayed (it will be, live), so a
  replayed message never goes out ahead of its group's live head.
- **Never past a failed group's head.** A group whose live delivery is failing (retrying, or
  parked in the DLQ) has messages older than its replayed ones still unfinished. Its replayed
  messages wait: the lane sets the group aside (``deferred``: the offset to read it again
  from) and goes on with the others; once the group is healthy again (an operator unsidelined
  it, or its head got through), a later pass reads the log from there for such groups only.
- **A pace.** Calls are paced to the replay's rate (its share per partition), so live
  traffic keeps the rest of the endpoint's capacity.
- **Progress that survives its owner.** Every second, and when the lane stops, the lane
  stores where reading may go on (every selected record below it finished) with its counts
  (``state.replays``). A new owner, after a crash or a rebalance, goes on from there: a
  replayed call may be made twice then, with the same ``webhook-id``, never skipped.

Live delivery does not wait for replays, and a replayed call may go out while a live call of
the same group does: a replay is a second delivery beside the first, marked by
``X_REPLAY_ID`` and a ``webhook-id`` of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Protocol

from confluent_kafka import Message

from delivery.dispatcher import Dispatcher
from delivery.effects import PartitionEffects
from delivery.engine import Attempt
from delivery.offsets import OffsetTracker
from delivery.ratelimit import TokenBucket
from delivery.replays import IngestMarks, source_of
from setu.clock import now_ms
from setu.model import DeadLetterPolicy, Subscription
from setu.ordering.records import Record
from setu.ordering.tiers import MAIN
from setu.outcome import Outcome, Verdict
from setu.policies import accepts
from setu.replay import LISTED, WRITE_SLACK_MS, PartitionProgress, Replay
from state.kafka_reader import record_of

log = logging.getLogger(__name__)

# Selected records a lane keeps in memory (waiting or being called) at most.
BUFFERED = 1_000
# Records read from the log at a time.
CHUNK = 500
# How often a lane stores its progress, and looks again at groups it set aside.
SAVE_S = 1.0
# Longest wait a lane takes when it has nothing to do (a call's end wakes it sooner).
IDLE_S = 0.5
# How long a first pass waits before reading the log's end again while the window's last
# messages may still be on their way.
TAIL_REST_S = 1.0
# How long a lane waits before looking again when live delivery has not finished the log's
# next record.
FRONTIER_REST_S = 0.2
# A Retry-After longer than this is not waited for by a replay's next attempt.
MAX_RETRY_AFTER_MS = 3_600_000


class ReplayProgressStore(Protocol):
    """Where replays' progress is kept (:class:`state.replays.ReplayStore`)."""

    def progress(self, replay_id: str) -> dict[int, PartitionProgress]: ...

    def save(self, replay_id: str, partition: int, progress: PartitionProgress) -> bool: ...

    def finish_if_complete(self, replay_id: str) -> bool: ...


class MainLog(Protocol):
    """The reads a lane makes (:class:`state.kafka_reader.KafkaReader`; blocking)."""

    def read(
        self, topic: str, partition: int, start: int, budget: int
    ) -> tuple[list[Message], int, bool]: ...

    def offset_for_time(self, topic: str, partition: int, timestamp_ms: int) -> int: ...


class Owner(Protocol):
    """The partition as the runner holds it (:class:`delivery.effects.PartitionEffects`)."""

    @property
    def alive(self) -> bool: ...

    @property
    def draining(self) -> bool: ...

    def blocks(self, group: str) -> bool:
        """Whether the group's live delivery is failing (retrying, or parked)."""
        ...

    def delivered_below(self) -> int | None:
        """The main-log offset below which live delivery has finished every record
        (delivered, dead-lettered, or parked behind its group); None: not known yet."""
        ...


class ReplayLane:
    """One replay on one owned partition; see the module doc. A :class:`Caller` of the
    subscription's dispatcher, settling its own calls."""

    def __init__(
        self,
        replay: Replay,
        sub: Subscription,
        partition: int,
        owner: Owner,
        main_topic: str,
        log_: MainLog,
        store: ReplayProgressStore,
        dispatcher: Dispatcher,
        clock: Callable[[], int] = now_ms,
        settle_ms: int = WRITE_SLACK_MS,
    ) -> None:
        """``settle_ms``: how long after the window's end the main log may still receive
        its messages (the ingest job's write comes a little after the produce)."""
        self.replay = replay
        self._settle_ms = settle_ms
        self.sub = sub
        self.partition = partition
        self._owner = owner
        self._topic = main_topic
        self._log = log_
        self._store = store
        self._dispatcher = dispatcher
        self._clock = clock
        self.calling = 0  # the dispatcher's count of this lane's calls being made
        self.progress: PartitionProgress | None = None
        self._tracker = OffsetTracker()
        self._scan = 0  # where reading goes on in the current pass
        self._marks = IngestMarks()  # main records an ingest replay wrote twice (delivery.replays)
        self._queues: dict[str, deque[Record]] = {}  # a group's selected records, waiting
        self._busy: set[str] = set()  # groups with a call out
        self._ready: deque[str] = deque()  # groups with records waiting and no call out
        self._loose: deque[Record] = deque()  # records of no group, waiting
        self._out = 0  # attempts handed to the dispatcher and not yet settled
        self._failed_groups: set[str] = set()
        self._bucket = TokenBucket(
            max(replay.rate_per_second / max(replay.partitions, 1), 0.1), now=time.monotonic()
        )
        self._wake = asyncio.Event()
        self._tail_rest = 0.0  # no read of the log's end before this (time.monotonic)
        self._stopped = False
        self._ended = False  # the replay is done on this partition, or no longer running

    # The dispatcher's view (delivery.dispatcher.Caller)

    @property
    def engine(self) -> ReplayLane:
        return self

    @property
    def alive(self) -> bool:
        return not self._stopped and self._owner.alive

    @property
    def draining(self) -> bool:
        return self._owner.draining

    @property
    def finished(self) -> bool:
        return self._ended

    # Lifecycle

    def stop(self) -> None:
        """Stops calling; :meth:`run` stores the progress and returns."""
        self._stopped = True
        self._wake.set()

    async def run(self) -> None:
        """Carries the replay out on this partition until it is done, stopped, or no longer
        running; progress is stored on the way out. An error ends the lane (the runner's
        part starts it again from its stored progress)."""
        try:
            if not await self._start():
                return
            saved = time.monotonic()
            while self.alive and not self._ended:
                self._wake.clear()
                got = await self._read() if self._room() else False
                self._pump()
                if self._pass_over():
                    await self._next_pass()
                if time.monotonic() - saved >= SAVE_S:
                    saved = time.monotonic()
                    await self._save()
                if not got and self.alive and not self._ended:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._wake.wait(), IDLE_S)
        finally:
            self._stopped = True
            if self.progress is not None and not self._ended:
                with contextlib.suppress(Exception):
                    await self._save()

    async def _start(self) -> bool:
        stored = (await asyncio.to_thread(self._store.progress, self.replay.id)).get(self.partition)
        if stored is None:
            start = await asyncio.to_thread(
                self._log.offset_for_time, self._topic, self.partition, self.replay.from_ms
            )
            stored = PartitionProgress(next_offset=start, end_offset=-1, read_to=start)
            self.progress = stored
            if not await self._save():
                return False
        if stored.done:
            self._ended = True
            return False
        self.progress = stored
        self._failed_groups = set(stored.failed_groups)
        self._scan = stored.next_offset
        self._tracker = OffsetTracker(stored.next_offset)
        return True

    # Reading

    def _room(self) -> bool:
        progress = self.progress
        assert progress is not None
        if progress.passing == {}:
            return False  # between passes
        if 0 <= progress.end_offset <= self._scan or time.monotonic() < self._tail_rest:
            return False
        return self._tracker.open_count < BUFFERED

    async def _read(self) -> bool:
        """Reads the next records of the pass, up to where live delivery has finished the
        log; False when it took none."""
        progress = self.progress
        assert progress is not None
        first_pass = progress.passing is None
        finding_end = first_pass and progress.end_offset < 0
        frontier = self._owner.delivered_below()
        if frontier is None or (frontier <= self._scan and not finding_end):
            self._tail_rest = time.monotonic() + FRONTIER_REST_S
            return False
        budget = min(CHUNK, BUFFERED - self._tracker.open_count)
        messages, position, at_end = await asyncio.to_thread(
            self._log.read, self._topic, self.partition, self._scan, budget
        )
        last_ms = self.replay.to_ms + self._settle_ms
        took = False
        for msg in messages:
            offset = msg.offset() or 0
            if 0 <= progress.end_offset <= offset:
                return True
            if finding_end and msg.timestamp()[1] > last_ms:
                progress.end_offset = offset  # written after the window could have been
                return True
            if offset >= frontier:
                # Not yet finished by live delivery: a replay delivers again what was
                # delivered, and never a group's message before its first delivery got
                # through (it could overtake a head that is about to fail and park).
                self._tail_rest = time.monotonic() + FRONTIER_REST_S
                return took
            self._scan = offset + 1
            self._take(msg, offset, first_pass)
            took = True
        self._scan = max(self._scan, position)
        if at_end and finding_end:
            if self._clock() >= last_ms:
                progress.end_offset = position  # everything of the window is written by now
            else:
                # The window's last messages may still be on their way through ingest: look
                # at the log's end again in a second.
                self._tail_rest = time.monotonic() + TAIL_REST_S
        return took

    def _take(self, msg: Message, offset: int, first_pass: bool) -> None:
        progress = self.progress
        assert progress is not None
        tracker = self._tracker
        tracker.read(offset)
        counted = first_pass and offset >= progress.read_to
        if counted:
            progress.read_to = offset + 1
            progress.scanned += 1
        try:
            rec = record_of(MAIN, msg)
        except ValueError:
            tracker.finish(offset)  # not a Setu message
            return
        envelope = rec.envelope
        twice = not self._marks.admit(
            offset,
            source_of(envelope.ingest_partition, envelope.ingest_log),
            envelope.ingest_offset,
        )
        if (
            twice
            or not self.replay.selects(envelope)
            or not accepts(self.sub.policies.filter, envelope)
        ):
            tracker.finish(offset)
            return
        if counted:
            progress.matched += 1
        group = envelope.group_id if self.sub.grouped else None
        if group is None:
            self._loose.append(rec)
            return
        passing = progress.passing
        if (
            group in progress.deferred
            or (passing is not None and offset < passing.get(group, offset + 1))
            or group in self._failed_groups
        ):
            if group in self._failed_groups and counted:
                progress.skipped += 1
            tracker.finish(offset)  # set aside, given up, or not part of this pass
            return
        queue = self._queues.get(group)
        if queue is None:
            queue = self._queues[group] = deque()
            if group not in self._busy:
                self._ready.append(group)
        queue.append(rec)

    # Calling

    def _pump(self) -> None:
        while self._loose and self._out < BUFFERED:
            self._submit(self._loose.popleft(), 1, 0)
        progress = self.progress
        assert progress is not None
        ready = self._ready
        while ready:
            group = ready.popleft()
            queue = self._queues.get(group)
            if not queue or group in self._busy:
                continue
            if self._owner.blocks(group):
                progress.deferred[group] = queue[0].offset
                self._finish_all(queue)
                del self._queues[group]
                continue
            self._busy.add(group)
            self._submit(queue[0], 1, 0)

    def _submit(self, rec: Record, number: int, delay_ms: int) -> None:
        wait_s = self._bucket.reserve(time.monotonic())
        due = self._clock() + delay_ms + int(wait_s * 1000) if (wait_s or delay_ms) else 0
        self._out += 1
        self._dispatcher.submit(
            self,
            Attempt(self.partition, rec, number, True, not_before_ms=due, replay=self.replay.id),
        )

    def on_result(self, attempt: Attempt, outcome: Outcome) -> None:
        """A replayed call ended (the dispatcher's :class:`Settles`)."""
        self._out -= 1
        self._wake.set()
        if self._stopped or self.progress is None:
            return
        progress = self.progress
        rec = attempt.record
        group = rec.group if self.sub.grouped else None
        if outcome.verdict is Verdict.DELIVERED:
            progress.delivered += 1
        elif outcome.verdict is Verdict.RETRY and attempt.number <= self.sub.retry.tiers:
            delay = self.sub.retry.delay_ms(attempt.number)
            if outcome.retry_after_ms is not None:
                delay = max(delay, min(outcome.retry_after_ms, MAX_RETRY_AFTER_MS))
            self._submit(rec, attempt.number + 1, delay)
            return
        else:
            progress.failed += 1
            if len(progress.failed_messages) < LISTED:
                progress.failed_messages.append(rec.message_id)
            if group is not None and self.sub.dead_letter_policy is DeadLetterPolicy.PARK:
                self._give_up(group)
        self._tracker.finish(rec.offset)
        if group is None:
            return
        self._busy.discard(group)
        queue = self._queues.get(group)
        if queue and queue[0] is rec:
            queue.popleft()
        if queue:
            self._ready.append(group)
        else:
            self._queues.pop(group, None)

    def _give_up(self, group: str) -> None:
        """A group's replayed message failed for good under ``park``: its later ones are
        left out, so the receiver never gets them out of order."""
        progress = self.progress
        assert progress is not None
        self._failed_groups.add(group)
        if group not in progress.failed_groups:
            progress.failed_groups.append(group)
        queue = self._queues.get(group)
        if queue and len(queue) > 1:
            head = queue.popleft()  # the failed one: on_result finishes it
            progress.skipped += len(queue)
            self._finish_all(queue)
            queue.clear()
            queue.append(head)

    def _finish_all(self, records: Iterable[Record]) -> None:
        for rec in records:
            self._tracker.finish(rec.offset)

    # Passes

    def _pass_over(self) -> bool:
        """Whether the current pass read its end and finished everything it selected."""
        progress = self.progress
        assert progress is not None
        if progress.passing == {}:
            return True
        return (
            0 <= progress.end_offset <= self._scan
            and self._tracker.open_count == 0
            and self._out == 0
        )

    async def _next_pass(self) -> None:
        """After a pass: another for the groups set aside that are healthy now, a wait while
        all of them are still failing, or the end."""
        progress = self.progress
        assert progress is not None
        if not progress.deferred:
            progress.done = True
            progress.passing = {}
            progress.next_offset = max(self._scan, progress.next_offset)
            self._ended = True
            await self._save()
            await asyncio.to_thread(self._store.finish_if_complete, self.replay.id)
            log.info(
                "replay %s of %s/%s: partition %d done (%d delivered, %d failed)",
                self.replay.id,
                self.sub.project,
                self.sub.name,
                self.partition,
                progress.delivered,
                progress.failed,
            )
            return
        healthy = {g: o for g, o in progress.deferred.items() if not self._owner.blocks(g)}
        if not healthy:
            progress.passing = {}  # waits; looked at again on the next turn
            return
        for group in healthy:
            del progress.deferred[group]
        start = min(healthy.values())
        progress.passing = healthy
        progress.next_offset = start
        self._scan = start
        self._tracker = OffsetTracker(start)
        self._marks = IngestMarks()

    async def _save(self) -> bool:
        progress = self.progress
        assert progress is not None
        if progress.passing != {} or progress.done:
            committable = self._tracker.committable()
            if committable is not None:
                progress.next_offset = committable
        keep = await asyncio.to_thread(self._store.save, self.replay.id, self.partition, progress)
        if not keep:
            self._ended = True  # cancelled, or its subscription is gone
        return keep


class _Owned:
    """A partition the runner holds, as a lane sees it."""

    __slots__ = ("_port",)

    def __init__(self, port: PartitionEffects) -> None:
        self._port = port

    @property
    def alive(self) -> bool:
        return self._port.alive

    @property
    def draining(self) -> bool:
        return self._port.draining

    def blocks(self, group: str) -> bool:
        return group in self._port.engine.states

    def delivered_below(self) -> int | None:
        # Nothing read since the takeover and no committed offset: live delivery has
        # finished nothing of this partition that the lane may count on.
        tracker = self._port.engine.trackers.get(MAIN)
        finished = None if tracker is None else tracker.committable()
        return 0 if finished is None else finished


class RunnerReplays:
    """The running replays of one runner's subscription, on the partitions the runner owns:
    a lane per (replay, partition), started and stopped as replays and partitions come and
    go (:meth:`tick`, once a second)."""

    def __init__(
        self,
        ports: dict[int, PartitionEffects],
        main_topic: str,
        log_: MainLog,
        store: ReplayProgressStore,
        settle_ms: int = WRITE_SLACK_MS,
    ) -> None:
        self._ports = ports
        self._settle_ms = settle_ms
        self._topic = main_topic
        self._log = log_
        self._store = store
        self._replays: dict[str, Replay] = {}
        self._lanes: dict[tuple[str, int], tuple[ReplayLane, asyncio.Task[None]]] = {}
        self._done: set[tuple[str, int]] = set()  # lanes that ended for good

    @property
    def active(self) -> bool:
        return bool(self._lanes)

    def set(self, replays: Iterable[Replay]) -> bool:
        """The subscription's running replays now (from the worker's listing); True when
        they changed."""
        now = {replay.id: replay for replay in replays}
        changed = now.keys() != self._replays.keys()
        self._replays = now
        return changed

    def replays(self) -> list[Replay]:
        return list(self._replays.values())

    def tick(self, sub: Subscription, dispatcher: Dispatcher | None) -> None:
        """Starts lanes for owned partitions of running replays, stops the others."""
        for key, (lane, task) in list(self._lanes.items()):
            replay_id, partition = key
            port = self._ports.get(partition)
            if task.done():
                del self._lanes[key]
                if lane.finished:
                    self._done.add(key)
                elif not task.cancelled() and task.exception() is not None:
                    log.warning(
                        "replay %s, partition %d: %r; going on from its stored progress",
                        replay_id,
                        partition,
                        task.exception(),
                    )
            elif replay_id not in self._replays or port is None or not port.alive:
                lane.stop()  # ended, or the partition moved away
            else:
                lane.sub = sub  # a changed filter, retry policy or endpoint applies from now
        self._done = {key for key in self._done if key[0] in self._replays}
        if dispatcher is None:
            return
        for replay in self._replays.values():
            for partition, port in self._ports.items():
                key = (replay.id, partition)
                if key in self._lanes or key in self._done or not port.alive or port.draining:
                    continue
                lane = ReplayLane(
                    replay,
                    sub,
                    partition,
                    _Owned(port),
                    self._topic,
                    self._log,
                    self._store,
                    dispatcher,
                    settle_ms=self._settle_ms,
                )
                task = asyncio.get_running_loop().create_task(lane.run())
                self._lanes[key] = (lane, task)

    async def close(self) -> None:
        for lane, _ in self._lanes.values():
            lane.stop()
        await asyncio.gather(*(task for _, task in self._lanes.values()), return_exceptions=True)
        self._lanes.clear()
