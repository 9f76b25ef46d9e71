"""A subscription's view of the worker's shared readers (decision 0011): the consumer port its
runner speaks (``delivery/parts.py``, ``ConsumerPort``), over the :class:`ReaderHub`.

The runner asks its consumer for four things, in commands it posts: ``pause``, ``resume``,
``seek`` and ``commit``. Here each command runs at once, on the loop, against a recorder, and
what it asked for goes where it belongs:

- the main log's partitions are the subscription's cursors: a pause takes its room away (its
  cursor falls behind, nobody waits), a resume gives it back, a seek moves the cursor;
- its retry tiers and DLQ are partitions of the hub's tiers consumer: the pause, resume or
  seek runs on that consumer's thread, and the command's callback is posted after it, as the
  runner's own consumer did (``delivery/kafka_io.py``); an operation asked for under one
  assignment of a partition index never runs under the next;
- a commit is written to the subscription's consumer group (``state/group_offsets.py``).

Assignments come from the hub: owning main partition p means owning index p of this
subscription, taken over with the runner's own ``assigned`` from the offsets in its group,
and given up with its ``revoked`` (drained, then committed there).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from confluent_kafka import OFFSET_BEGINNING, KafkaException, Message, TopicPartition

from delivery.flow import SEEK_RETRIES_QUIET, SEEK_RETRY_MAX_S
from delivery.kafka_io import RebalanceListener
from delivery.parts import SEEK_RETRY_S
from delivery.readers import ReaderHub
from setu.steps import Steps
from state.group_offsets import GroupNotEmpty, GroupOffsets

log = logging.getLogger(__name__)

T = TypeVar("T")
_VIEW_NUMBERS = itertools.count(1)
OFFSET_INVALID = -1001


class Flowing:
    """The runner's ``flowing`` switch (back-pressure, ``delivery/flow.py``): cleared, the
    subscription takes no more main-log records until it is set again."""

    def __init__(self, changed: Callable[[], None]) -> None:
        self._on = True
        self._changed = changed

    def set(self) -> None:
        if not self._on:
            self._on = True
            self._changed()

    def clear(self) -> None:
        if self._on:
            self._on = False
            self._changed()

    def is_set(self) -> bool:
        return self._on


class _Recorder:
    """What a command asked of "the consumer"."""

    def __init__(self) -> None:
        self.pauses: list[tuple[TopicPartition, bool]] = []
        self.seeks: list[TopicPartition] = []
        self.commits: list[TopicPartition] = []

    def pause(self, partitions: list[TopicPartition]) -> None:
        self.pauses.extend((tp, True) for tp in partitions)

    def resume(self, partitions: list[TopicPartition]) -> None:
        self.pauses.extend((tp, False) for tp in partitions)

    def seek(self, partition: TopicPartition) -> None:
        self.seeks.append(partition)

    def commit(self, offsets: list[TopicPartition] | None = None, **_: Any) -> None:
        self.commits.extend(offsets or [])


@dataclass(slots=True)
class _Dormant:
    """A tier partition with nothing to read that the tiers consumer is not given."""

    offset: int  # where its reading starts once woken
    paused: bool  # what the runner last asked: paused or not


class ViewListener(RebalanceListener, Protocol):
    """What a view asks of its runner besides what a consumer thread asks."""

    async def never_owned(self, partitions: list[int]) -> bool:
        """Whether the API created the subscription and no owner ever claimed any of these
        partitions since: its group holds no offsets in them (``born`` in state/changelog.py)."""
        ...


class SubscriptionView:
    """One runner's consumer (see the module doc)."""

    def __init__(
        self,
        config: dict[str, Any],
        loop: asyncio.AbstractEventLoop,
        listener: ViewListener,
        hub: ReaderHub,
        offsets: GroupOffsets,
    ) -> None:
        self.group: str = config["group.id"]
        # This view's cursors in the hub: its own, never a predecessor's under the same
        # group (a runner started again while the one before still leaves the hub).
        self.key = f"{self.group}#{next(_VIEW_NUMBERS)}"
        self._loop = loop
        self._listener = listener
        self._hub = hub
        self._offsets = offsets
        self.main_topic = ""
        self.tier_topics: list[str] = []
        self.flowing = Flowing(self._room_changed)
        self._done: asyncio.Future[None] = loop.create_future()
        self._closed = False
        self._owned: set[int] = set()  # partition indices taken over
        self._generation: dict[int, int] = {}  # per index: bumped at each take-over/give-up
        self._main_paused: set[int] = set()
        # Tier partitions whose current assignment has run on the tiers consumer's thread.
        self._tier_live: set[tuple[str | None, int | None]] = set()
        # Tier partitions with nothing to read, not assigned to the tiers consumer until a
        # copy is written there or the runner seeks them (module doc).
        self._dormant: dict[tuple[str, int], _Dormant] = {}
        self._lock = asyncio.Lock()  # take-overs and give-ups one at a time
        # Indices being taken over, and the tier work the runner asked for them meanwhile:
        # it runs once their tiers are assigned (a seek before it would be lost to the
        # assignment's start offsets).
        self._taking: set[int] = set()
        self._held: list[tuple[list[tuple[str, TopicPartition]], Callable[[], None] | None]] = []

    # The consumer port.

    @property
    def done(self) -> asyncio.Future[None]:
        return self._done

    @property
    def running(self) -> bool:
        return not self._done.done()

    def start(self, topics: Sequence[str]) -> None:
        """``topics``: the main log first, then the tiers and the DLQ (the runner's order)."""
        self.main_topic, self.tier_topics = topics[0], list(topics[1:])
        self._hub.register(self)

    def post(self, command: Callable[[Any], Any], then: Callable[[], None] | None = None) -> None:
        recorder = _Recorder()
        command(recorder)
        self._apply(recorder, then)
        if recorder.commits:
            self._loop.create_task(self._commit(recorder.commits))

    async def call(self, command: Callable[[Any], T]) -> T:
        recorder = _Recorder()
        result = command(recorder)
        done: asyncio.Future[None] = self._loop.create_future()

        def settle() -> None:
            if not done.done():
                done.set_result(None)

        self._apply(recorder, settle)
        await done
        if recorder.commits:
            await self._commit(recorder.commits)
        return result

    async def close(self) -> None:
        """Gives every partition index up (drained and committed) and leaves the hub, also
        after a failed take-over (:meth:`fail`): a view left in the hub would keep its
        cursors there, which its runner's successor, under the same name, would inherit."""
        if self._closed:
            return
        self._closed = True
        try:
            await self._hub.unregister(self)
        finally:
            if not self._done.done():
                self._done.set_result(None)

    def fail(self, error: BaseException) -> None:
        """A take-over failed: the runner gives up (the worker starts it again)."""
        if not self._done.done():
            self._done.set_exception(error)

    # From the hub.

    def has_room(self, partition: int) -> bool:
        return self.flowing.is_set() and partition not in self._main_paused

    def deliver(self, messages: list[Message]) -> None:
        """Records for the runner: main-log records its cursors took, and records of its tier
        partitions read under their current assignment (a batch the tiers consumer fetched
        before a partition was given up and taken over again comes from the old one)."""
        if not self.running:
            return
        live = self._tier_live
        main = self.main_topic
        kept = [m for m in messages if m.topic() == main or (m.topic(), m.partition()) in live]
        if kept:
            self._listener.on_batch(kept)

    async def take_over(self, partitions: list[int], queued_s: float = 0.0) -> dict[int, int]:
        """Takes partition indices over with the runner: main-log start offset per index
        (< 0: the partition's first offset); its tiers are assigned to the tiers consumer.
        ``queued_s``: how long it waited for a take-over slot of the hub (for the log)."""
        steps = Steps(log, queued_s)
        async with self._lock:
            steps.done("its turn")
            # Given up meanwhile (a revocation that ran before this take-over): not taken.
            wanted = [
                p for p in partitions if p not in self._owned and self._hub.owns(self.main_topic, p)
            ]
            if not wanted or not self.running:
                return {}
            if await self._offsets.has_members(self.group):
                raise GroupNotEmpty(
                    f"{self.group} has members: a worker of the earlier layout still serves it"
                )
            steps.done("the group's membership")
            topics = [self.main_topic, *self.tier_topics]
            asked = [TopicPartition(t, p) for p in wanted for t in topics]
            committed = await self._committed(wanted, asked)
            steps.done("its offsets")
            self._taking.update(wanted)
            try:
                plan = await self._listener.assigned(committed)
            finally:
                self._taking.difference_update(wanted)
                held, self._held = self._held, []
            steps.done("its state and tiers")
            steps.log_if_slow(f"{self.group}: take-over of partitions {wanted}")
            known = {(tp.topic, tp.partition): tp.offset for tp in committed}
            main: dict[int, int] = {}
            tiers: list[TopicPartition] = []
            for tp in plan.starts:
                offset = tp.offset
                if offset == OFFSET_INVALID:
                    offset = known.get((tp.topic, tp.partition), OFFSET_INVALID)
                if tp.topic == self.main_topic:
                    main[tp.partition] = offset if offset >= 0 else -1
                else:
                    start = offset if offset >= 0 else OFFSET_BEGINNING
                    tiers.append(TopicPartition(tp.topic, tp.partition, start))
            for p in wanted:
                self._owned.add(p)
                self._generation[p] = self._generation.get(p, 0) + 1
            paused = [tp for tp in plan.paused if tp.topic != self.main_topic]
            self._main_paused.update(
                tp.partition for tp in plan.paused if tp.topic == self.main_topic
            )

            idle = {(tp.topic, tp.partition) for tp in plan.idle}
            held_paused = {(tp.topic, tp.partition) for tp in paused}
            for tp in tiers:
                key = (tp.topic, tp.partition)
                if key in idle:
                    self._dormant[key] = _Dormant(tp.offset, key in held_paused)
            self._assign_tiers(
                wanted,
                [tp for tp in tiers if (tp.topic, tp.partition) not in idle],
                [tp for tp in paused if (tp.topic, tp.partition) not in idle],
            )
            for ops, then in held:
                self._tier_ops(ops, then)
            if plan.commit_now:
                await self._commit(plan.commit_now)
                if plan.after_commit is not None:
                    await plan.after_commit()
            return main

    def _assign_tiers(
        self, wanted: list[int], tiers: list[TopicPartition], paused: list[TopicPartition]
    ) -> None:
        """Assigns the tier partitions of the indices ``wanted`` to the tiers consumer, from
        ``tiers``' offsets, those in ``paused`` paused."""

        def assign(consumer: Any) -> None:
            # Still assigned from an earlier take-over whose give-up has not run: start over.
            current = {(tp.topic, tp.partition) for tp in consumer.assignment()}
            again = [tp for tp in tiers if (tp.topic, tp.partition) in current]
            if again:
                consumer.incremental_unassign(again)
            consumer.incremental_assign(tiers)
            consumer.resume(tiers)
            if paused:
                consumer.pause(paused)

        if tiers:
            # Its records count from when the assignment ran on the consumer's thread:
            # batches fetched before were read under an earlier one.
            generation = {p: self._generation[p] for p in wanted}
            started = [(tp.topic, tp.partition) for tp in tiers]

            def live() -> None:
                self._tier_live.update(
                    tp for tp in started if self._generation.get(tp[1]) == generation[tp[1]]
                )

            self._hub.tiers.post(assign, live)

    async def _committed(
        self, partitions: list[int], asked: list[TopicPartition]
    ) -> list[TopicPartition]:
        """The group's committed offsets of ``asked``, none asked of Kafka for a subscription
        the API created and nobody owned since: a short-lived consumer of the group per
        subscription was most of the broker's work when a thousand new ones were taken over."""
        try:
            never_owned = await self._listener.never_owned(partitions)
        except Exception as exc:  # the changelog not read: its offsets are asked instead
            log.warning("%s: whether it was ever owned is not known (%s)", self.group, exc)
            never_owned = False
        if never_owned:
            return [TopicPartition(tp.topic, tp.partition, OFFSET_INVALID) for tp in asked]
        return await self._offsets.committed(self.group, asked)

    async def give_up(self, partitions: list[int]) -> None:
        """Gives partition indices up: the runner drains them, its offsets are committed."""
        async with self._lock:
            mine = [p for p in partitions if p in self._owned]
            if not mine:
                return
            topics = [self.main_topic, *self.tier_topics]
            revoked = [TopicPartition(t, p) for p in mine for t in topics]
            offsets = await self._listener.revoked(revoked)
            self._forget(mine)
            if offsets:
                try:
                    await self._commit(offsets)
                except Exception as exc:
                    log.warning("%s: commit on revocation failed: %s", self.group, exc)
                else:
                    self._listener.committed(offsets)

    def lose(self, partitions: list[int]) -> None:
        mine = [p for p in partitions if p in self._owned]
        if mine:
            topics = [self.main_topic, *self.tier_topics]
            self._listener.lost([TopicPartition(t, p) for p in mine for t in topics])
            self._forget(mine)

    # Inside.

    def copied(self, topic: str, partition: int) -> None:
        """The runner wrote copies to a tier partition: the tiers consumer reads it from now
        on, if it did not already."""
        self._wake((topic, partition), None)

    def _wake(self, key: tuple[str, int], offset: int | None) -> None:
        """Assigns a dormant tier partition to the tiers consumer, from where its reading was
        to start (or ``offset``: a seek), paused if the runner last asked so."""
        dormant = self._dormant.pop(key, None)
        if dormant is None:
            return
        topic, partition = key
        start = TopicPartition(topic, partition, dormant.offset if offset is None else offset)
        paused = [TopicPartition(topic, partition)] if dormant.paused else []
        self._assign_tiers([partition], [start], paused)

    def _forget(self, partitions: list[int]) -> None:
        tiers = [
            TopicPartition(t, p)
            for p in partitions
            for t in self.tier_topics
            # A dormant one was never given to the tiers consumer.
            if self._dormant.pop((t, p), None) is None
        ]
        self._tier_live.difference_update((tp.topic, tp.partition) for tp in tiers)
        for p in partitions:
            self._owned.discard(p)
            self._main_paused.discard(p)
            self._generation[p] = self._generation.get(p, 0) + 1
        if tiers:
            self._hub.tiers.post(lambda c: c.incremental_unassign(tiers))

    def _room_changed(self) -> None:
        for p in self._owned:
            self._hub.room_changed(self, p, self.has_room(p))

    def _apply(self, recorder: _Recorder, then: Callable[[], None] | None) -> None:
        """Main-log pauses and seeks now, on the loop; tier ones on the tiers consumer's thread,
        ``then`` after them; commits in the background (``call`` awaits its own)."""
        tier_ops: list[tuple[str, TopicPartition]] = []
        for tp, on in recorder.pauses:
            if tp.topic == self.main_topic:
                (self._main_paused.add if on else self._main_paused.discard)(tp.partition)
                self._hub.room_changed(self, tp.partition, self.has_room(tp.partition))
            else:
                tier_ops.append(("pause" if on else "resume", tp))
        for tp in recorder.seeks:
            if tp.topic == self.main_topic:
                self._hub.seek(self, tp.partition, tp.offset)
            else:
                tier_ops.append(("seek", tp))
        if not tier_ops:
            if then is not None:
                self._loop.call_soon(then)
            return
        if any(tp.partition in self._taking for _, tp in tier_ops):
            self._held.append((tier_ops, then))  # run after the assignment (take_over)
            return
        self._tier_ops(tier_ops, then)

    def _tier_ops(
        self, ops: list[tuple[str, TopicPartition]], then: Callable[[], None] | None
    ) -> None:
        """Runs ``ops`` (:meth:`_run_tier_ops`) but those of dormant partitions: their pause
        or resume is kept for when they wake, and a seek wakes them at its offset."""
        kept: list[tuple[str, TopicPartition]] = []
        for op, tp in ops:
            dormant = self._dormant.get((tp.topic, tp.partition))
            if dormant is None:
                kept.append((op, tp))
            elif op == "seek":
                self._wake((tp.topic, tp.partition), tp.offset)
            else:
                dormant.paused = op == "pause"
        generations = {tp.partition: self._generation.get(tp.partition, 0) for _, tp in kept}
        self._run_tier_ops(kept, generations, then, 0)

    def _run_tier_ops(
        self,
        ops: list[tuple[str, TopicPartition]],
        generations: dict[int, int],
        then: Callable[[], None] | None,
        attempt: int,
    ) -> None:
        """Runs ``ops`` on the tiers consumer's thread, then posts ``then``. A seek librdkafka
        refuses (a partition whose fetcher is still starting, just after its assignment) is
        tried again until it takes, and ``then`` waits for it: the engine reads the tier from
        the sought offset once ``then`` ran, and records in between would be skipped."""

        def run(consumer: Any) -> None:
            refused: list[tuple[str, TopicPartition]] = []
            for op, tp in ops:
                if self._generation.get(tp.partition, 0) != generations[tp.partition]:
                    continue  # asked under an earlier assignment of the index
                try:
                    if op == "seek":
                        consumer.seek(tp)
                    else:
                        getattr(consumer, op)([TopicPartition(tp.topic, tp.partition)])
                except KafkaException as exc:
                    if op != "seek":
                        raise
                    if attempt == SEEK_RETRIES_QUIET:
                        log.warning("%s: seek %s refused (%s); trying again", self.group, tp, exc)
                    refused.append((op, tp))
            if refused:
                delay = min(SEEK_RETRY_S * 2**attempt, SEEK_RETRY_MAX_S)
                self._loop.call_soon_threadsafe(
                    self._loop.call_later,
                    delay,
                    self._run_tier_ops,
                    refused,
                    generations,
                    then,
                    attempt + 1,
                )
            elif then is not None:
                self._loop.call_soon_threadsafe(then)

        self._hub.tiers.post(run)

    async def _commit(self, offsets: list[TopicPartition]) -> None:
        await self._offsets.commit(self.group, offsets)
