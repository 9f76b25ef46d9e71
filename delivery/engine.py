"""Delivery of one partition index of one subscription: the main log's partition and the same
partition of every retry tier and of the DLQ, which the range assignor gives to one worker.

The engine is synchronous and does no I/O. The runner feeds it records (in offset order per
tier) and completions; it answers through its :class:`Effects` port. A state change always
runs as: ``effects.move`` (Kafka write, acknowledged) → :meth:`PartitionEngine.moved` (computes
the Redis write) → ``effects.persist`` → :meth:`PartitionEngine.persisted` (the change takes
effect in memory, the source records finish, and the group goes on). So Redis never describes
a Kafka write that did not happen, and an offset never finishes before its outcome is durable.

Per group there is one *lane*: the group's records waiting in memory, at most one attempt in
flight and at most one state change in progress. Lanes exist only while a group has something
in memory, so memory follows activity, not the number of groups.

One class, over 400 lines, on purpose: every decision reads and changes the same lanes, trackers
and group states, and the order-keeping rules (a follower queues behind its head, a leftover
goes to the tier holding its group, a released head laps before its group follows) are easiest
to check when each path through a group's life is one method next to the others. Its I/O is
elsewhere (:mod:`delivery.effects`); its pure rules are in ``setu/ordering/``.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol

from delivery.backoff import next_attempt_at
from delivery.offsets import OffsetTracker
from delivery.replays import IngestMarks, source_of
from setu.envelope import Envelope
from setu.model import DeadLetterPolicy, Subscription
from setu.ordering import groups
from setu.ordering.fencing import is_stale_copy
from setu.ordering.groups import Failure, Kind, Route
from setu.ordering.records import Record
from setu.ordering.state import GroupState, PartitionSnapshot, StateWrite
from setu.ordering.tiers import DLQ, HOLD, MAIN, after_failure, is_retry, next_tier
from setu.outcome import Outcome, Verdict
from setu.policies import accepts

# Parks and forwards of one group go out together, up to this many copies.
MAX_MOVE_BATCH = 256
# Tiers from the top down: a lane looks at its oldest messages' tiers first.
_TIERS_DOWN = tuple(range(DLQ, MAIN - 1, -1))
PARKED_REASON = "parked behind its failed group"
# A held head due within this long keeps its record in memory; a later one is read again from
# the main log when due (docs/scheduling.md), so memory does not grow with what is scheduled.
KEEP_HELD_MS = 60_000
# A message scheduled this close is called at its time without being held: no state write.
SHORT_WAIT_MS = 1_000


@dataclass(frozen=True, slots=True)
class Attempt:
    """One webhook call to make. ``number`` is the 1-based X_DELIVERY_ATTEMPT;
    ``not_before_ms`` delays it; ``replay``: the replay it belongs to (delivery/replaying.py),
    None for live delivery."""

    partition: int
    record: Record
    number: int
    independent: bool
    not_before_ms: int = 0
    replay: str | None = None


@dataclass(frozen=True, slots=True)
class Copy:
    """A copy of a message to write: ``envelope`` under delivery's own headers."""

    envelope: Envelope
    kind: Kind
    origin: tuple[int, int]
    due_at_ms: int


@dataclass(frozen=True, slots=True, eq=False)
class Move:
    """Copies of ``sources`` to write, in order, to partition ``partition`` of ``target``."""

    partition: int
    group: str | None
    sources: tuple[Record, ...]
    target: int
    kind: Kind
    copies: tuple[Copy, ...]


@dataclass(frozen=True, slots=True, eq=False)
class Transition:
    """A Redis write, and the records that finish once it is durable."""

    write: StateWrite
    sources: tuple[Record, ...] = ()
    releases: bool = False  # the write releases the group: look at its dead letters again


class Effects(Protocol):
    """What the engine asks of the world. Each call starts work and returns at once; its
    completion comes back as a call on the engine."""

    def dispatch(self, attempt: Attempt) -> None:
        """Call the webhook (not before ``attempt.not_before_ms``); then :meth:`on_result`."""

    def move(self, move: Move) -> None:
        """Write the copies, await the acks; then :meth:`moved` and persist what it returns."""

    def persist(self, transition: Transition) -> None:
        """Apply ``transition.write`` atomically; then :meth:`persisted`."""

    def delivered(self, partition: int, tier: int, offset: int) -> None:
        """Record a 2xx that changes no state (batched; no completion call)."""

    def filtered(self, partition: int, record: Record) -> None:
        """Count a main record the subscription's filter turned away (no completion call)."""

    def hold(self, partition: int, tier: int, offset: int, until_ms: int) -> None:
        """Pause the tier's partition at ``offset`` until ``until_ms``; then :meth:`unblocked`."""

    def seek(self, partition: int, tier: int, offset: int) -> None:
        """Move the tier's consumer back to ``offset``; then :meth:`unblocked`."""

    def recall(
        self, partition: int, group: str, offset: int, record: Record | None, first: bool
    ) -> None:
        """A held head is due: read its main record at ``offset`` unless ``record`` is given,
        and (``first``: before its first attempt) look whether its producer cancelled it;
        then :meth:`recalled`."""

    def unscheduled(self, partition: int, group: str, message_id: str, why: str) -> None:
        """A held head finished without a call: ``cancelled``, or ``gone`` from the main log
        (no completion call)."""


class Lane:
    """A group's records in memory and what is in progress for it."""

    __slots__ = ("busy", "delivering", "queues", "release", "result")

    def __init__(self) -> None:
        self.queues: dict[int, deque[Record]] = {}
        self.delivering: Attempt | None = None
        self.busy: Move | Transition | None = None
        self.result: tuple[Attempt, Outcome] | None = None
        self.release = False

    def idle(self) -> bool:
        return (
            self.delivering is None
            and self.busy is None
            and self.result is None
            and not self.release
            and not any(self.queues.values())
        )


class PartitionEngine:
    """Decisions for one partition index of ``sub``; see the module doc."""

    def __init__(
        self,
        sub: Subscription,
        partition: int,
        effects: Effects,
        snapshot: PartitionSnapshot,
        *,
        clock: Callable[[], int],
        rng: Callable[[], float],
        positions: dict[int, int] | None = None,
        epoch: int = 0,
        ingest_marks: Mapping[int, int] | None = None,
    ) -> None:
        self.sub = sub
        self.partition = partition
        self.effects = effects
        self.clock = clock
        self.rng = rng
        self.states: dict[str, GroupState] = dict(snapshot.states)
        self.replayed: set[tuple[int, int]] = set(snapshot.outcomes)
        self.pending: set[int] = set(snapshot.pending_releases)
        self.lanes: dict[str, Lane] = {}
        self.trackers: dict[int, OffsetTracker] = {
            tier: OffsetTracker(offset) for tier, offset in (positions or {}).items()
        }
        self.blocked: dict[int, int] = {}  # tier -> holds/seeks whose marker is still to come
        self.epoch = epoch  # this owner's epoch of the partition (0: unfenced)
        self.fences = snapshot.fences
        self.stale_copies = 0  # copies of a worker that had lost the partition, skipped
        self.ingest = IngestMarks(ingest_marks)  # see delivery.replays
        self.replay_copies = 0  # main records a replayed ingest batch wrote twice, skipped
        self.active = 0  # dispatches, moves and writes in progress
        self.in_flight = 0  # webhook calls in progress
        self._grouped = sub.grouped
        self._tiers = sub.retry.tiers
        self._releasing: set[str] = set()  # group releases handed in and not yet persisted
        # Held heads (docs/scheduling.md): when each is due, their records where kept, those
        # being read again, and those due and read, waiting for their lane.
        self.timers: list[tuple[int, str]] = []
        self.holds: dict[str, Record] = {}
        self.recalling: set[str] = set()
        # A due head's record to call, or why it finishes without a call.
        self.ready: dict[str, Record | str] = {}
        for group, state in self.states.items():
            if state.held >= 0:
                self.timers.append((state.due_at_ms, group))
        heapq.heapify(self.timers)
        # Where the DLQ must be read again from once the DLQ seek in flight has landed.
        self._dlq_wanted: int | None = None

    # Input: records

    def on_record(self, rec: Record) -> None:
        """A record read from ``rec.tier``; records of a tier arrive in offset order."""
        if rec.tier in self.blocked:
            return  # fetched before a hold or seek took effect: it will be read again
        tracker = self.trackers.get(rec.tier)
        if tracker is None:
            tracker = self.trackers[rec.tier] = OffsetTracker()
        if tracker.is_open(rec.offset):
            tracker.pass_over(rec.offset)  # a DLQ record read again while still in progress
            return
        if self._not_for_delivery(rec):
            return
        if is_retry(rec.tier) and rec.due_at_ms > self.clock():
            self.blocked[rec.tier] = 1
            tracker.rewind(rec.offset)
            self.effects.hold(self.partition, rec.tier, rec.offset, rec.due_at_ms)
            return
        tracker.read(rec.offset)
        if (rec.tier, rec.offset) in self.replayed:
            tracker.finish(rec.offset)  # its outcome was recorded before a restart
            return
        group = rec.group
        if group is None or not (self._grouped or self._scheduled_order(rec)):
            self._loose(rec)
            return
        lane = self.lanes.get(group)
        if lane is None:
            lane = self.lanes[group] = Lane()
            if rec.tier == MAIN and group not in self.states:
                self._deliver_or_hold(group, rec, lane)  # the common case: a healthy, idle group
                return
        queue = lane.queues.get(rec.tier)
        if queue is None:
            queue = lane.queues[rec.tier] = deque()
        queue.append(rec)
        if lane.busy is None:
            self._pump(group, lane)

    def _scheduled_order(self, rec: Record) -> bool:
        """In a subscription that does not keep order: whether ``rec`` still goes in group
        order, as scheduled messages and their copies do (docs/scheduling.md)."""
        if rec.kind is not None:
            return rec.kind.ordered
        return rec.tier == MAIN and rec.envelope.deliver_at_ms > self.clock()

    def _deliver_or_hold(self, group: str, rec: Record, lane: Lane) -> None:
        """A healthy group's main message: called now, or, scheduled for later, held."""
        due = rec.envelope.deliver_at_ms
        if not due or due - self.clock() <= SHORT_WAIT_MS:
            self._dispatch(rec, False, lane)  # not before its time (see _dispatch)
            return
        # It becomes the group's head and waits in the main log; its offset finishes (the
        # state names it), so the main log's commit moves on past it.
        finished = ((MAIN, rec.offset),)
        state = groups.marked(None, groups.held(rec.message_id, rec.offset, due), finished)
        write = StateWrite(
            self.partition, group, touches_group=True, state=state, outcomes=finished
        )
        if due - self.clock() <= KEEP_HELD_MS:
            self.holds[group] = replace(rec, held=True)
        self._persist(lane, Transition(write, (rec,)))

    # Input: time

    def next_due_ms(self) -> int | None:
        """When the earliest held head is due (None: none held)."""
        return self.timers[0][0] if self.timers else None

    def wake(self, now_ms: int) -> None:
        """Held heads due by ``now_ms`` are read again (:meth:`Effects.recall`)."""
        timers = self.timers
        while timers and timers[0][0] <= now_ms:
            due, group = heapq.heappop(timers)
            state = self.states.get(group)
            lane = self.lanes.get(group)
            calling = lane.delivering if lane is not None else None
            if (
                state is None
                or state.held < 0
                or state.due_at_ms != due
                or group in self.recalling
                or group in self.ready
                or (calling is not None and calling.record.held)
            ):
                # Changed since (delivered, moved on, due at another time), or under way. (A
                # stray of the group being called does not count: the head waits for the lane.)
                continue
            self.recalling.add(group)
            self.active += 1
            record = self.holds.pop(group, None)
            self.effects.recall(self.partition, group, state.held, record, state.attempts == 0)

    def recalled(self, group: str, record: Record | None, cancelled: bool) -> None:
        """A held head's record read again (None: the main log no longer has it), and whether
        its producer cancelled it (:meth:`Effects.recall`)."""
        self.active -= 1
        self.recalling.discard(group)
        state = self.states.get(group)
        if state is None or state.held < 0:
            return
        lane = self.lanes.get(group)
        if lane is None:
            lane = self.lanes[group] = Lane()
        if cancelled:
            self.ready[group] = "cancelled"
        elif record is None:
            self.ready[group] = "gone"
        else:
            self.ready[group] = replace(record, held=True)
        if lane.busy is None:
            self._pump(group, lane)

    def _unschedule(self, group: str, lane: Lane, why: str) -> None:
        """The held head finishes without a call (see :meth:`recalled`)."""
        state = self.states[group]
        self.effects.unscheduled(self.partition, group, state.head or "", why)
        after = groups.marked(state, groups.head_done(state, HOLD, state.held))
        self._persist(lane, Transition(self._group_write(group, state, after)))

    def _not_for_delivery(self, rec: Record) -> bool:
        """Finishes a record that no group may see: a stale worker's copy, a replayed
        ingest batch's second copy, or a main record the subscription's filter turns away."""
        stale = rec.epoch is not None and rec.epoch < self.epoch and self._stale(rec)
        if stale or self._replay_copy(rec):
            return True
        if rec.tier == MAIN and not accepts(self.sub.policies.filter, rec.envelope):
            # Not wanted (docs/policies.md §1): it never holds its group back; copies in retry
            # tiers were wanted when they were read, so a changed filter leaves them be.
            self._pass_over(rec)
            self.effects.filtered(self.partition, rec)
            return True
        return False

    def _stale(self, rec: Record) -> bool:
        """Skips a copy written by a worker that had lost the partition (see
        :mod:`setu.ordering.fencing`): its source is this owner's to handle."""
        if not is_stale_copy(self.fences, rec.tier, rec.offset, rec.epoch):
            return False
        self._pass_over(rec)
        self.stale_copies += 1
        return True

    def _replay_copy(self, rec: Record) -> bool:
        """Skips a main record that a replayed ingest batch wrote a second time (see
        :mod:`delivery.replays`): its original was read before it."""
        envelope = rec.envelope
        if rec.tier != MAIN or self.ingest.admit(
            rec.offset,
            source_of(envelope.ingest_partition, envelope.ingest_log),
            envelope.ingest_offset,
        ):
            return False
        self._pass_over(rec)
        self.replay_copies += 1
        return True

    def _pass_over(self, rec: Record) -> None:
        """A record read and finished at once, without a call."""
        tracker = self.trackers[rec.tier]
        tracker.read(rec.offset)
        tracker.finish(rec.offset)

    def skip(self, tier: int, offset: int) -> None:
        """A record that is not a Setu message: nothing to deliver, but its offset finishes."""
        if tier in self.blocked:
            return
        tracker = self.trackers.get(tier)
        if tracker is None:
            tracker = self.trackers[tier] = OffsetTracker()
        if not tracker.is_open(offset):
            tracker.read(offset)
            tracker.finish(offset)

    def unblocked(self, tier: int, offset: int) -> None:
        """A hold or seek took effect: the tier's records come again from ``offset``."""
        left = self.blocked.get(tier, 0) - 1
        if left > 0:
            self.blocked[tier] = left
            return
        self.blocked.pop(tier, None)
        if tier == DLQ and self._dlq_wanted is not None:
            wanted, self._dlq_wanted = self._dlq_wanted, None
            if wanted < offset:
                self.trackers.setdefault(DLQ, OffsetTracker(offset))
                self._seek_dlq(wanted)  # asked for while this seek was on its way
                return
        tracker = self.trackers.get(tier)
        if tracker is None:
            self.trackers[tier] = OffsetTracker(offset)
        else:
            tracker.rewind(offset)

    # Input: operator requests

    def release_groups(self, group_ids: Iterable[str]) -> None:
        """Operators asked to deliver these groups' dead letters again (in order)."""
        for group in group_ids:
            if group in self._releasing:
                continue
            self._releasing.add(group)
            lane = self.lanes.get(group)
            if lane is None:
                lane = self.lanes[group] = Lane()
            lane.release = True
            self._pump(group, lane)

    def add_pending_releases(self, offsets: Iterable[int]) -> None:
        """Operators asked to deliver these single dead letters again."""
        new = set(offsets) - self.pending
        if new:
            self.pending |= new
            self._revisit_dlq(min(new))

    # Input: completions

    def on_result(self, attempt: Attempt, outcome: Outcome) -> None:
        """The webhook call of ``attempt`` ended with ``outcome``."""
        self.active -= 1
        self.in_flight -= 1
        group = attempt.record.group
        lane = self.lanes.get(group) if group is not None else None
        if lane is None or group is None or lane.delivering is not attempt:
            self._settle(None, None, attempt, outcome)
            return
        lane.delivering = None
        rec = attempt.record
        if (
            rec.tier == MAIN
            and not rec.held
            and outcome.verdict is Verdict.DELIVERED
            and lane.busy is None
            and not lane.release
            and not any(lane.queues.values())
        ):
            # The common case: a healthy group's message delivered, nothing waiting.
            del self.lanes[group]
            self.trackers[MAIN].finish(rec.offset)
            self.effects.delivered(self.partition, MAIN, rec.offset)
            return
        lane.result = (attempt, outcome)
        self._pump(group, lane)

    def moved(self, move: Move, offsets: list[int]) -> Transition:
        """The copies of ``move`` are acknowledged at ``offsets``: the write to persist next."""
        group = move.group
        state = self.states.get(group) if group is not None else None
        n = len(move.sources)
        # A lap leaves its dead letter in place (the group parks on it again if the lap fails),
        # so the letter gets no outcome; a single letter sent round again is finished.
        outcomes = tuple(
            (src.tier, src.offset)
            for src in move.sources
            if not (src.tier == DLQ and move.kind is Kind.LAP)
        )
        again = tuple(
            src.offset for src in move.sources if src.tier == DLQ and not move.kind.ordered
        )
        retried = n if move.target != DLQ else 0
        dead_lettered = n if move.target == DLQ else 0
        if move.kind.changes_state and group is not None:
            new = state
            now = self.clock()
            for src, copy, offset in zip(move.sources, move.copies, offsets, strict=True):
                new = groups.apply_copy(
                    new,
                    move.kind,
                    src.tier,
                    move.target,
                    src.message_id,
                    copy_offset=offset,
                    source_offset=src.offset,
                    now_ms=now,
                    attempts=copy.envelope.attempt,
                    status=copy.envelope.last_status,
                    reason=copy.envelope.failure_reason or "",
                )
            new = groups.marked(state, new, outcomes, {move.target: offsets[0]})
            write = StateWrite(
                self.partition,
                group,
                touches_group=True,
                expected_version=state.version if state is not None else 0,
                state=new,
                outcomes=outcomes,
                retried=retried,
                dead_lettered=dead_lettered,
            )
        else:
            write = StateWrite(
                self.partition,
                group,
                outcomes=outcomes,
                retried=retried,
                dead_lettered=dead_lettered,
                releases_done=again,
                redelivered=again,
            )
        transition = Transition(write, move.sources)
        lane = self.lanes.get(group) if group is not None else None
        if lane is not None and lane.busy is move:
            lane.busy = transition
        return transition

    def persisted(self, transition: Transition) -> None:
        """``transition.write`` is durable: it takes effect here."""
        self.active -= 1
        write = transition.write
        group = write.group
        if write.touches_group and group is not None:
            before = self.states.get(group)
            new = write.state
            if (
                new is not None
                and new.held >= 0
                and (before is None or (before.held, before.due_at_ms) != (new.held, new.due_at_ms))
            ):
                heapq.heappush(self.timers, (new.due_at_ms, group))  # a held head's time
            if write.state is None:
                self.states.pop(group, None)
            else:
                self.states[group] = write.state
        for src in transition.sources:
            if not src.held:
                self.trackers[src.tier].finish(src.offset)
        self.pending.difference_update(write.releases_done)
        if write.release_request_done and group is not None:
            self._releasing.discard(group)
        if transition.releases and write.state is not None:
            self._revisit_dlq(write.state.dlq_from)
        lane = self.lanes.get(group) if group is not None else None
        if lane is not None and group is not None and lane.busy is transition:
            lane.busy = None
            self._pump(group, lane)

    # Output: what the runner reads

    def committable(self) -> dict[int, int]:
        """Per tier, the offset that may be committed now."""
        out = {}
        for tier, tracker in self.trackers.items():
            offset = tracker.committable()
            if offset is not None:
                out[tier] = offset
        return out

    def ingest_marks(self, main_offset: int) -> dict[int, int]:
        """What a commit of ``main_offset`` in the main log carries (:mod:`delivery.replays`)."""
        return self.ingest.below(main_offset)

    def oldest_held_ms(self) -> int | None:
        """When the oldest message of a group this engine holds unfinished (read, waiting or
        being called) was produced; None when it holds none."""
        oldest: int | None = None
        for lane in self.lanes.values():
            held = [queue[0] for queue in lane.queues.values() if queue]
            if lane.delivering is not None:
                held.append(lane.delivering.record)
            for rec in held:
                at = rec.envelope.produced_at_ms
                if at and (oldest is None or at < oldest):
                    oldest = at
        return oldest

    def open_count(self, tier: int) -> int:
        tracker = self.trackers.get(tier)
        return 0 if tracker is None else tracker.open_count

    def any_open(self) -> bool:
        """Whether any record read from any tier is not finished."""
        return any(tracker.open_count for tracker in self.trackers.values())

    def retry_backlog(self) -> int:
        """Messages of failed groups waiting in retry tiers (a held head waits in the main
        log, though it counts in tier 1)."""
        return sum(sum(s.counts[1:DLQ]) - (s.held >= 0) for s in self.states.values())

    # Decisions

    def _is_loose(self, rec: Record) -> bool:
        """Outside group order: ungrouped, no group, or a copy made outside it."""
        return rec.kind is Kind.RETRY or rec.kind is Kind.DEAD or rec.kind is Kind.SKIP

    def _route(self, state: GroupState | None, rec: Record) -> tuple[Route, bool]:
        """The route of ``rec`` and whether it goes outside group order."""
        if rec.kind is Kind.LAP:
            return groups.route_lap(state, rec.tier, rec.message_id), False
        if self._is_loose(rec):
            if rec.tier == DLQ:
                return (Route.DELIVER if rec.offset in self.pending else Route.SKIP), True
            return Route.DELIVER, True
        route = groups.route(state, rec.tier, rec.message_id, rec.offset)
        return route, route is Route.STRAY

    def _loose(self, rec: Record) -> None:
        """A record of an ungrouped subscription (or without a group): no lane, no order."""
        if rec.tier == DLQ and rec.offset not in self.pending:
            self.trackers[DLQ].finish(rec.offset)
            return
        self._dispatch(rec, True, None)

    def _pump(self, group: str, lane: Lane) -> None:
        while lane.busy is None:
            if lane.result is not None:
                attempt, outcome = lane.result
                lane.result = None
                self._settle(group, lane, attempt, outcome)
            elif lane.release:
                lane.release = False
                self._release(group, lane)
            elif not self._step(group, lane):
                break
        if lane.idle() and group not in self.ready:
            del self.lanes[group]

    def _step(self, group: str, lane: Lane) -> bool:
        """Start the next thing the lane can do; False when it can do nothing now."""
        state = self.states.get(group)
        if lane.delivering is None and group in self.ready:
            due = self.ready.pop(group)  # a held head (docs/scheduling.md)
            if isinstance(due, str):
                self._unschedule(group, lane, due)
            else:
                self._dispatch(due, False, lane, state)
            return True
        queues = lane.queues
        for tier in _TIERS_DOWN if len(queues) > 1 else queues:
            queue = queues.get(tier)
            if not queue:
                continue
            rec = queue[0]
            route, loose = self._route(state, rec)
            if route is Route.SKIP:
                queue.popleft()
                self.trackers[tier].finish(rec.offset)
                return True
            if route is Route.WAIT:
                continue
            if route is Route.DELIVER or route is Route.STRAY:
                if lane.delivering is not None:
                    continue
                queue.popleft()
                if tier == MAIN and not loose:
                    self._deliver_or_hold(group, rec, lane)
                else:
                    self._dispatch(rec, loose, lane, state)
                return True
            assert state is not None
            # The records behind it that go the same way go along (not a lap's copy, say,
            # which waits in the same tier for its own attempt).
            batch = [queue.popleft()]
            while (
                queue
                and len(batch) < MAX_MOVE_BATCH
                and self._route(state, queue[0]) == (route, False)
            ):
                batch.append(queue.popleft())
            kind = Kind.PARK if route is Route.PARK else Kind.FORWARD
            self._move(lane, group, batch, groups.target(state, route, tier), kind, None, None)
            return True
        return False

    def _dispatch(
        self, rec: Record, loose: bool, lane: Lane | None, state: GroupState | None = None
    ) -> None:
        """Calls the webhook for ``rec``, not before its producer asked (docs/scheduling.md: a
        scheduled message that waited behind its group in a retry tier waits there for its
        time too). When ``rec`` is the head of its group's ``state``, the state may know of
        more attempts than the record says (a dead letter that went on a lap, a head that waits
        in its tier) and of a due time (the latter)."""
        before = not_before = 0
        if state is not None and state.head == rec.message_id:
            before, not_before = state.attempts, state.due_at_ms
        number = max(rec.envelope.attempt, before) + 1
        if rec.envelope.deliver_at_ms > not_before:
            not_before = rec.envelope.deliver_at_ms
        attempt = Attempt(self.partition, rec, number, loose, not_before)
        if lane is not None:
            lane.delivering = attempt
        self.active += 1
        self.in_flight += 1
        self.effects.dispatch(attempt)

    def _settle(
        self, group: str | None, lane: Lane | None, attempt: Attempt, outcome: Outcome
    ) -> None:
        rec = attempt.record
        if rec.tier == DLQ:
            self._settle_dead_letter(group, lane, attempt, outcome)
            return
        if rec.kind is Kind.LAP and group is not None:
            self._settle_lap(group, lane, attempt, outcome)
            return
        if outcome.verdict is Verdict.DELIVERED:
            if rec.held and group is not None:
                state = self.states[group]
                after = groups.marked(state, groups.head_done(state, HOLD, rec.offset))
                self._persist(lane, Transition(self._group_write(group, state, after, delivered=1)))
                return
            if attempt.independent or rec.tier == MAIN:
                self.trackers[rec.tier].finish(rec.offset)
                self.effects.delivered(self.partition, rec.tier, rec.offset)
                return
            assert group is not None
            write = self._head_delivered(group, rec.tier, rec.offset, ((rec.tier, rec.offset),))
            self._persist(lane, Transition(write, (rec,)))
            return
        ordered = not attempt.independent and group is not None
        tier = HOLD if rec.held else rec.tier
        to = after_failure(attempt.number, tier, self._tiers)
        if rec.held and attempt.number > self._tiers:
            to = DLQ  # a held head has a main message's budget: with no retry tiers, none
        now = self.clock()
        if outcome.verdict is Verdict.RETRY and to == tier and ordered:
            assert group is not None and lane is not None
            self._wait_in_place(group, lane, attempt, outcome)
        elif outcome.verdict is Verdict.RETRY and to != DLQ:
            if to == rec.tier:
                to = attempt.number  # a copy outside group order goes where its attempts say
            kind = Kind.HEAD if ordered else Kind.RETRY
            self._move(lane, group, [rec], to, kind, (attempt, outcome), self._due(to, outcome))
        elif ordered and self.sub.dead_letter_policy is DeadLetterPolicy.PARK:
            self._move(lane, group, [rec], DLQ, Kind.HEAD, (attempt, outcome), now)
        elif ordered:
            self._move(lane, group, [rec], DLQ, Kind.SKIP, (attempt, outcome), now)
        else:
            self._move(lane, group, [rec], DLQ, Kind.DEAD, (attempt, outcome), now)

    def _wait_in_place(self, group: str, lane: Lane, attempt: Attempt, outcome: Outcome) -> None:
        """The head failed in its retry tier with attempts of its own to spare: it waits there,
        in memory and first in its lane's queue, for its own backoff; its attempts and due
        time go to the group's state, so a successor that reads the record again goes on
        from them (see :func:`setu.ordering.tiers.after_failure`)."""
        rec = attempt.record
        state = self.states[group]
        due = self._due(attempt.number, outcome)
        failure = Failure(attempt.number, outcome.status, outcome.reason, self.clock())
        write = self._group_write(
            group, state, groups.head_waits(state, rec.message_id, failure, due), retried=1
        )
        if rec.held:  # it waits in the main log, as it did for its time (wake)
            if due - self.clock() <= KEEP_HELD_MS:
                self.holds[group] = rec
        else:
            queue = lane.queues.get(rec.tier)
            if queue is None:
                queue = lane.queues[rec.tier] = deque()
            queue.appendleft(rec)
        self._persist(lane, Transition(write))

    def _settle_dead_letter(
        self, group: str | None, lane: Lane | None, attempt: Attempt, outcome: Outcome
    ) -> None:
        """A dead letter delivered again. Success finishes it. A failure that is retried sends
        it through the retry tiers again: a single letter as a loose copy (which ends in the
        DLQ as a new letter if it keeps failing), a group's head on a lap (see
        :mod:`setu.ordering.groups`). A failure that is not retried, or no retry tiers, leaves it
        dead: a single letter as a new letter with its latest attempt, a group parked on it."""
        rec = attempt.record
        offset = rec.offset
        now = self.clock()
        retry = outcome.verdict is Verdict.RETRY and self._tiers > 0
        if outcome.verdict is Verdict.DELIVERED:
            if attempt.independent:
                write = StateWrite(
                    self.partition,
                    group,
                    releases_done=(offset,),
                    redelivered=(offset,),
                    delivered=1,
                )
            else:
                assert group is not None
                write = self._head_delivered(group, DLQ, offset, ())
            self._persist(lane, Transition(write, (rec,)))
        elif attempt.independent:
            due = self._due(1, outcome) if retry else now
            kind = Kind.RETRY if retry else Kind.DEAD
            self._move(lane, group, [rec], 1 if retry else DLQ, kind, (attempt, outcome), due)
        elif retry:
            self._move(lane, group, [rec], 1, Kind.LAP, (attempt, outcome), self._due(1, outcome))
        else:
            self._repark(group, lane, attempt, outcome)

    def _settle_lap(
        self, group: str, lane: Lane | None, attempt: Attempt, outcome: Outcome
    ) -> None:
        """The lap's copy of a released head was attempted (see :mod:`setu.ordering.groups`)."""
        rec = attempt.record
        state = self.states[group]
        to = next_tier(rec.tier, self._tiers)
        if outcome.verdict is Verdict.DELIVERED:
            write = StateWrite(
                self.partition,
                group,
                touches_group=True,
                expected_version=state.version,
                state=groups.marked(state, groups.lap_done(state), ((rec.tier, rec.offset),)),
                outcomes=((rec.tier, rec.offset),),
                delivered=1,
            )
            self._persist(lane, Transition(write, (rec,), releases=True))
        elif outcome.verdict is Verdict.RETRY and to != DLQ:
            self._move(lane, group, [rec], to, Kind.LAP, (attempt, outcome), self._due(to, outcome))
        else:
            self._repark(group, lane, attempt, outcome)

    def _repark(
        self, group: str | None, lane: Lane | None, attempt: Attempt, outcome: Outcome
    ) -> None:
        """A released head failed for good: its group parks on its letter again."""
        assert group is not None
        rec = attempt.record
        state = self.states[group]
        failure = Failure(attempt.number, outcome.status, outcome.reason, self.clock())
        write = self._group_write(
            group,
            state,
            groups.marked(
                state,
                groups.reparked(
                    state,
                    rec.message_id,
                    state.dlq_from if rec.tier != DLQ else rec.offset,
                    failure,
                ),
                ((rec.tier, rec.offset),) if rec.tier != DLQ else (),
            ),
            outcomes=((rec.tier, rec.offset),) if rec.tier != DLQ else (),
            dead_lettered=1,
        )
        self._persist(lane, Transition(write, (rec,)))

    def _due(self, tier: int, outcome: Outcome) -> int:
        """When a copy moved to retry tier ``tier`` after ``outcome`` is due."""
        return next_attempt_at(
            self.clock(),
            self.sub.retry.delay_ms(tier),
            rnd=self.rng(),
            retry_after_ms=outcome.retry_after_ms,
        )

    def _head_delivered(
        self, group: str, tier: int, offset: int, outcomes: tuple[tuple[int, int], ...]
    ) -> StateWrite:
        """The state write for a group whose head at (``tier``, ``offset``) got its 2xx."""
        state = self.states[group]
        after = groups.marked(state, groups.head_done(state, tier, offset), ((tier, offset),))
        return self._group_write(group, state, after, outcomes=outcomes, delivered=1)

    def _group_write(
        self, group: str, before: GroupState, after: GroupState | None, **more: Any
    ) -> StateWrite:
        """A write that changes ``group`` from ``before`` (version-checked) to ``after``."""
        return StateWrite(
            self.partition,
            group,
            touches_group=True,
            expected_version=before.version,
            state=after,
            **more,
        )

    def _release(self, group: str, lane: Lane) -> None:
        state = self.states.get(group)
        if state is None or not groups.releasable(state):
            write = StateWrite(self.partition, group, release_request_done=True)
            self._persist(lane, Transition(write))
            return
        write = StateWrite(
            self.partition,
            group,
            touches_group=True,
            expected_version=state.version,
            state=groups.released(state),
            release_request_done=True,
        )
        self._persist(lane, Transition(write, releases=True))

    def _move(
        self,
        lane: Lane | None,
        group: str | None,
        sources: list[Record],
        target: int,
        kind: Kind,
        failure: tuple[Attempt, Outcome] | None,
        due_at_ms: int | None,
    ) -> None:
        now = self.clock()
        copies = []
        for src in sources:
            env = src.envelope
            if failure is not None:
                attempt, outcome = failure
                env = env.evolve(
                    attempt=attempt.number,
                    failure_reason=outcome.reason,
                    last_status=outcome.status,
                    failed_at_ms=now,
                )
            elif target == DLQ:
                env = env.evolve(failure_reason=PARKED_REASON, failed_at_ms=now)
            if src.tier == MAIN and env.main_offset is None:
                env = env.evolve(main_offset=src.offset)
            copies.append(
                Copy(env, kind, (src.tier, src.offset), now if due_at_ms is None else due_at_ms)
            )
        move = Move(self.partition, group, tuple(sources), target, kind, tuple(copies))
        if lane is not None:
            lane.busy = move
        self.active += 1
        self.effects.move(move)

    def _persist(self, lane: Lane | None, transition: Transition) -> None:
        if lane is not None:
            lane.busy = transition
        self.active += 1
        self.effects.persist(transition)

    def _revisit_dlq(self, offset: int) -> None:
        """Read the DLQ again from ``offset`` if its consumer is already past it.

        One DLQ seek at a time: while one is on its way, a lower offset is remembered and
        sought once it lands. Two seeks in flight could land in either order (the runner tries
        a refused seek again later), and the consumer would stay where the last one put it,
        past the letters the other was for: a released group would never be delivered."""
        if DLQ in self.blocked:
            held = self._dlq_wanted
            self._dlq_wanted = offset if held is None else min(held, offset)
            return
        tracker = self.trackers.get(DLQ)
        if tracker is None or tracker.position is None or offset >= tracker.position:
            return
        self._seek_dlq(offset)

    def _seek_dlq(self, offset: int) -> None:
        tracker = self.trackers[DLQ]
        self.blocked[DLQ] = self.blocked.get(DLQ, 0) + 1
        tracker.rewind(offset)
        # Letters queued from there on come again, in order: keeping them would put the
        # re-read older ones behind them.
        for lane in self.lanes.values():
            queue = lane.queues.get(DLQ)
            while queue and queue[-1].offset >= offset:
                tracker.unread(queue.pop().offset)
        self.effects.seek(self.partition, DLQ, offset)
