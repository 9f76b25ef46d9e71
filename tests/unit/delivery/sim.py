"""A deterministic world around one :class:`PartitionEngine`: Kafka logs as lists, the stub
group store as Redis, a webhook whose answers the test chooses, and a clock that only moves
when told. Every effect the engine asks for waits until the test completes it, so tests can
interleave completions in any order and crash the worker between any two of them.

A crash loses everything in memory: the engine, pending webhook calls, Kafka writes not yet
acknowledged, Redis writes not yet applied and 2xx outcomes not yet flushed. A restart does
what the runner does on assignment: claim the partition, read the tails, complete cut-short
changes, record the fence, reload.

Redis forgetting is a crash after which the recorded outcomes are gone: only the changelog's
group state, releases and letters come back, and records read again must be recognised by the
groups' done marks.

A stall is a crash whose worker lives on: another worker takes the partition over while the
stalled one keeps its calls and writes in progress and may finish them later (it reads
nothing new). Its Kafka copies land after the new owner's fence; every Redis write it tries
must be refused.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from delivery.engine import Attempt, Move, PartitionEngine, Transition
from delivery.recovery import missing_writes
from setu.envelope import Envelope, KafkaHeaders
from setu.model import DeadLetterPolicy, Endpoint, RetryPolicy, Subscription
from setu.ordering.groups import Kind, releasable
from setu.ordering.records import Record, copy_headers, parse_record
from setu.ordering.state import Fenced
from setu.ordering.tiers import DLQ, MAIN
from setu.outcome import Outcome, classify_error, classify_status
from state.groups_stub import StubGroupStore

T = TypeVar("T")
P = 0  # the one partition index simulated


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Runs a coroutine of the stub store, which never really awaits."""
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    raise RuntimeError("the stub store awaited something")


def subscription(
    grouped: bool = True,
    policy: DeadLetterPolicy = DeadLetterPolicy.PARK,
    delays: tuple[int, ...] = (100, 300),
) -> Subscription:
    return Subscription(
        project="p",
        name="s",
        topic="t",
        endpoint=Endpoint("http://hook.test/"),
        grouped=grouped,
        retry=RetryPolicy(delays_ms=delays),
        dead_letter_policy=policy,
    )


class _Detached:
    """Where a stalled worker's pauses and seeks go: nowhere that matters."""

    def __init__(self) -> None:
        self.positions: dict[int, int] = {}
        self.paused: dict[int, tuple[int, int]] = {}
        self.markers: deque[tuple[int, int]] = deque()


@dataclass
class Stalled:
    """A worker that lost the partition without noticing."""

    engine: PartitionEngine
    effects: SimEffects
    epoch: int
    refused: int = 0  # Redis writes it tried and the store refused


class SimEffects:
    def __init__(self, world: World | _Detached) -> None:
        self.world = world
        self.dispatches: list[Attempt] = []
        self.moves: list[Move] = []
        self.persists: list[Transition] = []
        self.unflushed: list[tuple[int, int]] = []
        self.filtered_ids: list[str] = []
        self.recalls: list[tuple[str, int, Record | None, bool]] = []

    def dispatch(self, attempt: Attempt) -> None:
        self.dispatches.append(attempt)

    def move(self, move: Move) -> None:
        self.moves.append(move)

    def persist(self, transition: Transition) -> None:
        write = transition.write
        if isinstance(self.world, World) and write.dead_lettered and write.state is not None:
            # Dead-lettered without a copy: a released letter that failed for good, on which
            # its group parks again
            head = write.state.head or ""
            self.world.check_budget(head, write.state.attempts, write.state.last_status)
        self.persists.append(transition)

    def delivered(self, partition: int, tier: int, offset: int) -> None:
        self.unflushed.append((tier, offset))

    def filtered(self, partition: int, record: Record) -> None:
        self.filtered_ids.append(record.envelope.message_id)

    def hold(self, partition: int, tier: int, offset: int, until_ms: int) -> None:
        self.world.positions[tier] = offset
        self.world.paused[tier] = (until_ms, offset)

    def seek(self, partition: int, tier: int, offset: int) -> None:
        self.world.positions[tier] = offset
        self.world.markers.append((tier, offset))

    def recall(
        self, partition: int, group: str, offset: int, record: Record | None, first: bool
    ) -> None:
        self.recalls.append((group, offset, record, first))

    def unscheduled(self, partition: int, group: str, message_id: str, why: str) -> None:
        if isinstance(self.world, World):
            assert why == "cancelled", f"{message_id} {why}"
            self.world.unscheduled.add(message_id)


class World:
    def __init__(self, sub: Subscription) -> None:
        self.sub = sub
        # Tier 1 exists with no retry tiers too: scheduled messages' followers wait there.
        self.tiers = [MAIN, *range(1, max(sub.retry.tiers, 1) + 1), DLQ]
        self.logs: dict[int, list[tuple[KafkaHeaders, bytes]]] = {t: [] for t in self.tiers}
        self.committed: dict[int, int] = {}
        self.store = StubGroupStore()
        self.now = 1_000_000
        self.published: dict[str, list[str]] = defaultdict(list)
        self.raw: list[tuple[str, str]] = []  # every 2xx call: (group, message id)
        self.first: dict[str, list[str]] = defaultdict(list)  # first 2xx per group, in order
        self.delivered_ids: set[str] = set()
        self.crashes = 0
        self.count = 0
        self.stalled: list[Stalled] = []
        self.calls: dict[str, int] = defaultdict(int)  # webhook calls made per message id
        self.numbers: dict[str, list[int]] = defaultdict(list)  # their X_DELIVERY_ATTEMPTs
        self.scheduled: dict[str, int] = {}  # message id -> when it may be delivered
        self.cancelled: set[str] = set()  # what producers cancelled
        self.unscheduled: set[str] = set()  # cancelled before its first call
        self.start()

    # The worker's life

    def start(self) -> None:
        self.epoch = run(self.store.claim(P))
        snapshot = run(self.store.load(P))
        tail = [
            parse_record(t, o, *self.logs[t][o])
            for t in self.tiers
            if t != MAIN
            for o in range(self.committed.get(t, 0), len(self.logs[t]))
        ]
        writes, _ = missing_writes(
            P,
            snapshot.states,
            snapshot.outcomes,
            self.committed,
            tail,
            self.now,
            pending=set(snapshot.pending_releases),
            fences=snapshot.fences,
        )
        for write in writes:
            run(self.store.apply(write, self.epoch))
        ends = {t: len(self.logs[t]) for t in self.tiers if t != MAIN}
        run(self.store.record_fences(P, self.epoch, ends))
        snapshot = run(self.store.load(P))
        positions = {t: self.committed.get(t, 0) for t in self.tiers}
        revisit = [s.dlq_from for s in snapshot.states.values() if s.released]
        positions[DLQ] = min([positions[DLQ], *revisit, *snapshot.pending_releases])
        self.positions = dict(positions)
        self.paused: dict[int, tuple[int, int]] = {}
        self.markers: deque[tuple[int, int]] = deque()
        self.effects = SimEffects(self)
        self.engine = PartitionEngine(
            self.sub,
            P,
            self.effects,
            snapshot,
            clock=lambda: self.now,
            rng=lambda: 0.5,
            positions=positions,
            epoch=self.epoch,
        )
        self.engine.release_groups(snapshot.release_requests)

    def crash(self) -> None:
        self.crashes += 1
        self.start()

    def redis_forgets(self) -> None:
        """Redis loses what only it held and the worker takes the partition over again: the
        group state, releases, letters and owner epoch come back from the changelog (here:
        they stay in the stub), the recorded outcomes and counters do not
        (state/durable_groups.py)."""
        self.store.partitions[P].outcomes.clear()
        self.crash()

    def stall(self) -> None:
        """The worker stalls and another takes over; the stalled one lives on (see above)."""
        self.crashes += 1
        self.effects.world = _Detached()
        self.stalled.append(Stalled(self.engine, self.effects, self.epoch))
        self.start()

    # A stalled worker waking up

    def stalled_respond(self, which: int, index: int, answer: int | str) -> None:
        """The webhook answers a call the stalled worker made."""
        stalled = self.stalled[which]
        attempt = stalled.effects.dispatches.pop(index)
        self.count_call(attempt)
        outcome = self.outcome(answer)
        if 200 <= (outcome.status or 0) < 300:
            self.on_2xx(attempt)
        stalled.engine.on_result(attempt, outcome)

    def stalled_move(self, which: int, index: int) -> None:
        """The stalled worker's copies reach Kafka, under its old epoch."""
        stalled = self.stalled[which]
        move = stalled.effects.moves.pop(index)
        offsets = self.append_copies(move, stalled.epoch)
        stalled.effects.persists.append(stalled.engine.moved(move, offsets))

    def stalled_persist(self, which: int, index: int) -> None:
        """The stalled worker tries a Redis write (with its unflushed 2xx outcomes)."""
        stalled = self.stalled[which]
        transition = stalled.effects.persists.pop(index)
        delivered = {P: list(stalled.effects.unflushed)}
        try:
            run(self.store.apply_batch(delivered, [transition.write], {P: stalled.epoch}))
        except Fenced:
            stalled.refused += 1
            return
        raise AssertionError("a stalled worker's Redis write went through")

    # Producers and operators

    def publish(
        self,
        group: str | None,
        produced_at_ms: int = 0,
        headers: tuple[tuple[str, str], ...] = (),
        deliver_in_ms: int = 0,
    ) -> str:
        self.count += 1
        message_id = f"{group or 'm'}-{self.count}"
        deliver_at = self.now + deliver_in_ms if deliver_in_ms else 0
        if deliver_at:
            self.scheduled[message_id] = deliver_at
        env = Envelope(
            message_id,
            message_id.encode(),
            group_id=group,
            produced_at_ms=produced_at_ms,
            headers=headers,
            deliver_at_ms=deliver_at,
        )
        self.logs[MAIN].append((env.kafka_headers(), env.body))
        self.published[group or ""].append(message_id)
        return message_id

    def release(self, group: str) -> None:
        run(self.store.request_release(P, [group], []))
        self.engine.release_groups([group])

    def release_loose(self) -> None:
        """Asks for every single dead letter not yet delivered again."""
        done = run(self.store.redelivered(P))
        offsets = [
            o
            for o, rec in enumerate(self.dead_letters())
            if rec.kind in (Kind.DEAD, Kind.SKIP) and o not in done
        ]
        if offsets:
            run(self.store.request_release(P, [], offsets))
            self.engine.add_pending_releases(offsets)

    def dead_letters(self) -> list[Record]:
        return [parse_record(DLQ, o, *raw) for o, raw in enumerate(self.logs[DLQ])]

    # Consumer

    def poll(self, tier: int) -> bool:
        """Hands the engine pending seek markers, then the tier's next record."""
        while self.markers:
            self.engine.unblocked(*self.markers.popleft())
        if tier in self.paused or self.positions[tier] >= len(self.logs[tier]):
            return False
        offset = self.positions[tier]
        self.positions[tier] = offset + 1
        self.engine.on_record(parse_record(tier, offset, *self.logs[tier][offset]))
        return True

    def tick(self, ms: int) -> None:
        self.now += ms
        for tier, (until, offset) in list(self.paused.items()):
            if until <= self.now:
                del self.paused[tier]
                self.engine.unblocked(tier, offset)
        self.engine.wake(self.now)

    def next_wake(self) -> int:
        """How long until the next call, paused tier or held head is due (at least 50 ms)."""
        times = [a.not_before_ms for a in self.effects.dispatches]
        times += [until for until, _ in self.paused.values()]
        due = self.engine.next_due_ms()
        if due is not None:
            times.append(due)
        if not times:
            return max(self.sub.retry.delays_ms, default=0) + 100
        return max(50, min(times) - self.now)

    def cancel(self, message_id: str) -> None:
        """The producer cancels a scheduled message."""
        self.cancelled.add(message_id)

    def finish_recall(self, index: int) -> None:
        """A held head's record is read again from the main log, and its cancel looked up."""
        group, offset, record, first = self.effects.recalls.pop(index)
        if record is None:
            record = parse_record(MAIN, offset, *self.logs[MAIN][offset])
        self.engine.recalled(group, record, first and record.message_id in self.cancelled)

    # Completions

    def answerable(self) -> list[int]:
        return [i for i, a in enumerate(self.effects.dispatches) if a.not_before_ms <= self.now]

    def outcome(self, answer: int | str) -> Outcome:
        if isinstance(answer, str):
            return classify_error(answer)
        return classify_status(answer, self.sub.retry)

    def respond(self, index: int, answer: int | str) -> None:
        attempt = self.effects.dispatches.pop(index)
        self.count_call(attempt)
        outcome = self.outcome(answer)
        if 200 <= (outcome.status or 0) < 300:
            self.on_2xx(attempt)
        self.engine.on_result(attempt, outcome)

    def count_call(self, attempt: Attempt) -> None:
        """X_DELIVERY_ATTEMPT counts the message's own calls: never ahead of them (a crash may
        make it repeat a number, never skip one)."""
        message_id = attempt.record.message_id
        self.calls[message_id] += 1
        self.numbers[message_id].append(attempt.number)
        assert 1 <= attempt.number <= self.calls[message_id], (
            f"{message_id} called as attempt {attempt.number} on its call {self.calls[message_id]}"
        )

    def on_2xx(self, attempt: Attempt) -> None:
        rec = attempt.record
        group = rec.group or ""
        message_id = rec.message_id
        self.raw.append((group, message_id))
        assert self.now >= self.scheduled.get(message_id, 0), f"{message_id} called early"
        if message_id in self.delivered_ids:
            return
        if self.sub.grouped and rec.tier != DLQ:
            # Order: everything published before it is delivered already, or (skip policy)
            # was dead-lettered on its own, or was filtered out.
            dead = set(self.effects.filtered_ids) | self.unscheduled
            if self.sub.dead_letter_policy is DeadLetterPolicy.SKIP:
                dead |= {r.message_id for r in self.dead_letters() if r.kind is Kind.SKIP}
            ids = self.published[group]
            for earlier in ids[: ids.index(message_id)]:
                assert earlier in self.delivered_ids or earlier in dead, (
                    f"{message_id} delivered before {earlier}; first deliveries {self.first[group]}"
                )
        if self.sub.grouped and rec.tier == DLQ and rec.kind is not None and rec.kind.ordered:
            ids = self.published[group]
            for earlier in ids[: ids.index(message_id)]:
                assert earlier in self.delivered_ids or earlier in self.unscheduled, (
                    f"{message_id} released before {earlier}"
                )
        self.delivered_ids.add(message_id)
        self.first[group].append(message_id)

    def append_copies(self, move: Move, epoch: int) -> list[int]:
        log = self.logs[move.target]
        offsets = []
        for copy in move.copies:
            if move.target == DLQ and copy.kind in (Kind.HEAD, Kind.SKIP, Kind.DEAD):
                env = copy.envelope
                self.check_budget(env.message_id, env.attempt, env.last_status)
            offsets.append(len(log))
            headers = copy_headers(copy.envelope, copy.kind, copy.origin, copy.due_at_ms, epoch)
            log.append((headers, copy.envelope.body))
        return offsets

    def finish_move(self, index: int) -> None:
        move = self.effects.moves.pop(index)
        offsets = self.append_copies(move, self.epoch)
        self.effects.persists.append(self.engine.moved(move, offsets))

    def check_budget(self, message_id: str, attempts: int, last_status: int | None) -> None:
        """Every message keeps its own retry budget (docs/design.md §4): one dead-lettered after a
        retryable failure has failed N+1 attempts of its own."""
        if last_status is not None and not self.sub.retry.is_retryable(last_status):
            return
        budget = self.sub.retry.tiers + 1
        assert attempts >= budget, (
            f"{message_id} dead-lettered after {attempts} of its {budget} attempts ({last_status})"
        )

    def finish_persist(self, index: int) -> None:
        transition = self.effects.persists.pop(index)
        # As the runner does: 2xx outcomes before any state change, so a failed group's
        # state implies its earlier deliveries are recorded.
        self.flush()
        run(self.store.apply(transition.write, self.epoch))
        self.engine.persisted(transition)

    def flush(self) -> None:
        run(self.store.record_delivered(P, self.effects.unflushed))
        self.effects.unflushed.clear()

    def commit(self) -> None:
        self.flush()
        committable = self.engine.committable()
        assert all(offset >= 0 for offset in committable.values())
        self.committed.update(committable)
        run(self.store.trim(P, committable))

    # Running to the end

    def busy(self) -> bool:
        e = self.effects
        return bool(e.dispatches or e.moves or e.persists or e.recalls or self.markers)

    def drain(self, rounds: int = 400) -> None:
        """Heals the webhook and runs until nothing is left to do, releasing every parked
        group and dead letter on the way; fails if that does not converge."""
        for _ in range(rounds):
            progressed = False
            for tier in self.tiers:
                while self.poll(tier):
                    progressed = True
            while self.answerable():
                self.respond(self.answerable()[0], 200)
                progressed = True
            progressed = self.complete_writes() or progressed
            for group, state in list(self.store.groups.items()):
                if releasable(state[1]) and group not in run(self.store.poll_releases(P))[0]:
                    self.release(group)
                    progressed = True
            self.release_loose_if_any()
            if not progressed and not self.busy():
                if self.paused or self.effects.dispatches or self.engine.next_due_ms():
                    self.tick(self.next_wake())
                    continue
                self.commit()
                return
            if not progressed:
                self.tick(self.next_wake())
        raise AssertionError("the world did not settle")

    def complete_writes(self) -> bool:
        """Acknowledges every Kafka write, applies every Redis write and completes every
        read-back in progress; whether there was any."""
        done = False
        while self.effects.moves or self.effects.persists or self.effects.recalls:
            if self.effects.moves:
                self.finish_move(0)
            elif self.effects.persists:
                self.finish_persist(0)
            else:
                self.finish_recall(0)
            done = True
        return done

    def release_loose_if_any(self) -> None:
        done = run(self.store.redelivered(P))
        pending = run(self.store.poll_releases(P))[1]
        if any(
            r.kind in (Kind.DEAD, Kind.SKIP) and o not in done and o not in pending
            for o, r in enumerate(self.dead_letters())
        ):
            self.release_loose()
