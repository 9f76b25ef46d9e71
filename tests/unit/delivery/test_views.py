"""A subscription's view of the shared readers (delivery/views.py): where each of the runner's
consumer commands goes, and that one asked under an earlier assignment never runs."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from confluent_kafka import TopicPartition

from delivery.kafka_io import Assignment
from delivery.views import SubscriptionView

MAIN, RQ1, DLQ = "setu.p.t", "setu.p.s.rq.1", "setu.p.s.dlq"


class FakeTiers:
    """The tiers consumer's thread, run at once; records what ran on "the consumer"."""

    def __init__(self) -> None:
        self.ran: list[tuple[str, Any]] = []
        self.refuse_seeks = 0

    def post(self, command: Callable[[Any], Any], then: Callable[[], None] | None = None) -> None:
        command(self)
        if then is not None:
            then()

    def pause(self, tps: list[TopicPartition]) -> None:
        self.ran += [("pause", (tp.topic, tp.partition)) for tp in tps]

    def resume(self, tps: list[TopicPartition]) -> None:
        self.ran += [("resume", (tp.topic, tp.partition)) for tp in tps]

    def seek(self, tp: TopicPartition) -> None:
        from confluent_kafka import KafkaError, KafkaException

        if self.refuse_seeks:
            self.refuse_seeks -= 1
            raise KafkaException(KafkaError(KafkaError._STATE))
        self.ran.append(("seek", (tp.topic, tp.partition, tp.offset)))

    def assignment(self) -> list[TopicPartition]:
        return []

    def incremental_assign(self, tps: list[TopicPartition]) -> None:
        self.ran += [("assign", (tp.topic, tp.partition, tp.offset)) for tp in tps]

    def incremental_unassign(self, tps: list[TopicPartition]) -> None:
        self.ran += [("unassign", (tp.topic, tp.partition)) for tp in tps]


class FakeHub:
    def __init__(self) -> None:
        self.tiers = FakeTiers()
        self.rooms: list[tuple[int, bool]] = []
        self.seeks: list[tuple[int, int]] = []
        self.unregistered: list[SubscriptionView] = []

    def owns(self, topic: str, partition: int) -> bool:
        return True

    def register(self, view: SubscriptionView) -> None:
        pass

    async def unregister(self, view: SubscriptionView) -> None:
        self.unregistered.append(view)

    def room_changed(self, view: SubscriptionView, partition: int, room: bool) -> None:
        self.rooms.append((partition, room))

    def seek(self, view: SubscriptionView, partition: int, offset: int) -> None:
        self.seeks.append((partition, offset))


class FakeOffsets:
    def __init__(self) -> None:
        self.commits: list[list[tuple[str, int, int]]] = []

    async def has_members(self, group: str) -> bool:
        return False

    async def committed(self, group: str, tps: list[TopicPartition]) -> list[TopicPartition]:
        return [
            TopicPartition(tp.topic, tp.partition, 5 if tp.topic == MAIN else -1001) for tp in tps
        ]

    async def commit(self, group: str, offsets: list[TopicPartition]) -> None:
        self.commits.append([(tp.topic, tp.partition, tp.offset) for tp in offsets])


class FakeRunner:
    def __init__(self) -> None:
        self.batches: list[Any] = []

    def on_batch(self, messages: list[Any]) -> None:
        self.batches.append(messages)

    async def never_owned(self, partitions: list[int]) -> bool:
        return False

    async def assigned(self, committed: list[TopicPartition]) -> Assignment:
        starts = [TopicPartition(tp.topic, tp.partition, -1001) for tp in committed]
        return Assignment(starts, [])

    async def revoked(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        return [TopicPartition(MAIN, 0, 9)]

    def committed(self, offsets: list[TopicPartition]) -> None:
        pass

    def lost(self, partitions: list[TopicPartition]) -> None:
        pass


def view_of(hub: Any, offsets: Any, runner: Any = None) -> SubscriptionView:
    """A started view of subscription s of topic t (``runner``: a FakeRunner by default)."""
    loop = asyncio.get_running_loop()
    view = SubscriptionView(
        {"group.id": "setu.sub.p.s"}, loop, runner or FakeRunner(), hub, offsets
    )
    view.start([MAIN, RQ1, DLQ])
    return view


def test_commands_go_to_the_cursor_the_tiers_consumer_or_the_group() -> None:
    async def scenario() -> None:
        hub, offsets = FakeHub(), FakeOffsets()
        view = view_of(hub, offsets)
        # Taken over from the group's offsets: the main log from its commit, tiers from
        # their beginning (no commit)
        assert await view.take_over([0]) == {0: 5}
        assert ("assign", (RQ1, 0, -2)) in hub.tiers.ran
        # A pause of the main partition takes the cursor's room; of a tier, pauses it
        view.post(lambda c: c.pause([TopicPartition(MAIN, 0), TopicPartition(RQ1, 0)]))
        assert hub.rooms[-1] == (0, False)
        assert hub.tiers.ran[-1] == ("pause", (RQ1, 0))
        # A tier seek runs before its callback; one refused is tried again until it takes
        hub.tiers.refuse_seeks = 2
        after: list[str] = []
        view.post(lambda c: c.seek(TopicPartition(DLQ, 0, 3)), lambda: after.append("then"))
        for _ in range(50):
            if after:
                break
            await asyncio.sleep(0.05)
        assert after == ["then"]
        assert hub.tiers.ran[-1] == ("seek", (DLQ, 0, 3))
        # A commit goes to the subscription's group
        await view.call(lambda c: c.commit(offsets=[TopicPartition(MAIN, 0, 7)]))
        assert offsets.commits[-1] == [(MAIN, 0, 7)]

    asyncio.run(scenario())


class NeverOwnedRunner(FakeRunner):
    """A subscription the API created and nobody owned since (or, ``fails``, a changelog
    that could not be read)."""

    def __init__(self, fails: bool = False) -> None:
        super().__init__()
        self.fails = fails

    async def never_owned(self, partitions: list[int]) -> bool:
        if self.fails:
            raise OSError("the changelog is away")
        return True


class CountedOffsets(FakeOffsets):
    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    async def committed(self, group: str, tps: list[TopicPartition]) -> list[TopicPartition]:
        self.reads += 1
        return await super().committed(group, tps)


def test_a_subscription_never_owned_starts_at_the_first_offset_without_asking_kafka() -> None:
    async def scenario() -> None:
        hub, offsets = FakeHub(), CountedOffsets()
        view = view_of(hub, offsets, NeverOwnedRunner())
        # Its group holds no offsets: the main log from its first offset, asked of nobody
        assert await view.take_over([0]) == {0: -1}
        assert offsets.reads == 0
        # A changelog that cannot say: the group's offsets are asked, as for any
        other, asked = FakeHub(), CountedOffsets()
        assert await view_of(other, asked, NeverOwnedRunner(fails=True)).take_over([0]) == {0: 5}
        assert asked.reads == 1

    asyncio.run(scenario())


def test_a_tier_command_asked_under_an_earlier_assignment_never_runs() -> None:
    async def scenario() -> None:
        hub, offsets = FakeHub(), FakeOffsets()
        view = view_of(hub, offsets)
        await view.take_over([0])
        hub.tiers.refuse_seeks = 1  # the seek waits for its retry ...
        view.post(lambda c: c.seek(TopicPartition(RQ1, 0, 3)))
        await view.give_up([0])  # ... while the index is given up
        assert offsets.commits[-1] == [(MAIN, 0, 9)]
        await asyncio.sleep(0.3)
        assert not any(op == "seek" for op, _ in hub.tiers.ran)

    asyncio.run(scenario())


class GatedOffsets(FakeOffsets):
    """Offsets whose committed read waits for ``gate``: a takeover still under way."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()

    async def committed(self, group: str, tps: list[TopicPartition]) -> list[TopicPartition]:
        await self.gate.wait()
        return await super().committed(group, tps)


class LosingRunner(FakeRunner):
    def __init__(self) -> None:
        super().__init__()
        self.lost_partitions: list[tuple[str, int]] = []

    def lost(self, partitions: list[TopicPartition]) -> None:
        self.lost_partitions += [(tp.topic, tp.partition) for tp in partitions]


class FakeReader:
    def post(self, command: Callable[[Any], Any], then: Callable[[], None] | None = None) -> None:
        if then is not None:
            then()

    def subscribe(self, topics: list[str]) -> None:
        pass


def test_a_main_partition_that_moves_on_during_its_takeover_is_let_go() -> None:
    """A worker that loses (or gives up) a main partition while one of its subscriptions is
    still taking it over must not keep it: another worker owns it now, and a view left holding
    it would go on serving its retry tiers beside that worker (seen with 100 subscriptions)."""
    from delivery.readers import ReaderHub

    async def scenario() -> None:
        hub = ReaderHub(lambda group: {}, lambda topic, partition: 0, "setu.delivery")
        tiers = FakeTiers()
        hub.membership, hub.catch_up = FakeReader(), FakeReader()  # type: ignore[assignment]
        hub.tiers = tiers  # type: ignore[assignment]
        # Given a worker that owns main partition 0, and a subscription taking it over
        await hub._main_assigned([TopicPartition(MAIN, 0)])
        offsets, runner = GatedOffsets(), LosingRunner()
        view_of(hub, offsets, runner)
        await asyncio.sleep(0.05)  # the takeover waits for the subscription's offsets
        # When the worker loses the partition meanwhile, and the takeover then completes
        hub._main_lost([TopicPartition(MAIN, 0)])
        offsets.gate.set()
        for _ in range(50):
            if runner.lost_partitions:
                break
            await asyncio.sleep(0.02)
        # Then the subscription lets it go: its runner is told, its tiers are unassigned
        assert (MAIN, 0) in runner.lost_partitions
        assert ("unassign", (RQ1, 0)) in tiers.ran
        assert not hub.owns(MAIN, 0)

    asyncio.run(scenario())


class ReleasingRunner(FakeRunner):
    """A runner whose take-over finds an operator's release: it seeks the DLQ back while it
    is still taking the partition over (delivery/commits.py polls releases meanwhile)."""

    def __init__(self) -> None:
        super().__init__()
        self.view: SubscriptionView | None = None
        self.after: list[str] = []

    async def assigned(self, committed: list[TopicPartition]) -> Assignment:
        assert self.view is not None
        self.view.post(
            lambda c: c.seek(TopicPartition(DLQ, 0, 0)), lambda: self.after.append("then")
        )
        await asyncio.sleep(0)
        return await super().assigned(committed)


def test_a_tier_seek_asked_during_a_takeover_runs_after_the_assignment() -> None:
    async def scenario() -> None:
        hub, offsets, runner = FakeHub(), FakeOffsets(), ReleasingRunner()
        view = runner.view = view_of(hub, offsets, runner)
        # When the runner seeks the DLQ back to 0 while it takes partition 0 over
        await view.take_over([0])
        for _ in range(50):
            if runner.after:
                break
            await asyncio.sleep(0.01)
        # Then the seek ran after the DLQ partition was assigned from its commit, so the
        # runner reads the DLQ from 0, and was told so only then
        ran = [e for e in hub.tiers.ran if e[1][0] == DLQ and e[0] in ("assign", "seek")]
        assert ran == [("assign", (DLQ, 0, -2)), ("seek", (DLQ, 0, 0))]
        assert runner.after == ["then"]

    asyncio.run(scenario())


def test_a_view_whose_takeover_failed_still_leaves_the_hub_when_its_runner_closes_it() -> None:
    async def scenario() -> None:
        hub, offsets = FakeHub(), FakeOffsets()
        view = view_of(hub, offsets)
        # Given a take-over that failed (the runner sees its consumer done, with the error)
        view.fail(RuntimeError("Redis went away"))
        assert view.done.done()
        # When the runner closes its consumer, as it does on its way out
        await view.close()
        await view.close()
        # Then the view left the hub (once): no cursor of it stays for its successor
        assert hub.unregistered == [view]

    asyncio.run(scenario())


class FailingRunner(FakeRunner):
    """A runner whose drain at revocation fails (Redis away, say)."""

    async def revoked(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        raise ConnectionError("Redis went away")


def test_a_view_whose_give_up_failed_leaves_no_cursor_for_its_successor() -> None:
    """A cursor left in the hub goes on taking records, for the next view of the same
    subscription: taken there before that view's own cursor starts, they never reach it."""
    from delivery.readers import ReaderHub

    async def scenario() -> None:
        hub = ReaderHub(lambda group: {}, lambda topic, partition: 0, "setu.delivery")
        hub.membership, hub.catch_up = FakeReader(), FakeReader()  # type: ignore[assignment]
        hub.tiers = FakeTiers()  # type: ignore[assignment]
        # Given a subscription's view holding main partition 0
        await hub._main_assigned([TopicPartition(MAIN, 0)])
        view = view_of(hub, FakeOffsets(), FailingRunner())
        cursors = hub._owned[(MAIN, 0)]
        for _ in range(50):
            if view.key in cursors:
                break
            await asyncio.sleep(0.01)
        assert view.key in cursors
        # When its runner closes it and the give-up fails
        with contextlib.suppress(ConnectionError):
            await view.close()
        # Then it left the hub all the same: no cursor, no view of it remains
        assert cursors.subscriptions() == []
        assert hub._views == {}
        # And its successor, under the same subscription, gets a cursor of its own
        successor = view_of(hub, FakeOffsets())
        assert successor.key != view.key
        for _ in range(50):
            if successor.key in cursors:
                break
            await asyncio.sleep(0.01)
        assert cursors.subscriptions() == [successor.key]

    asyncio.run(scenario())


class IdleTiersRunner(FakeRunner):
    """A runner whose takeover found nothing to read in the DLQ (its end reached), and
    asked for it to start paused."""

    async def assigned(self, committed: list[TopicPartition]) -> Assignment:
        plan = await super().assigned(committed)
        plan.idle = [TopicPartition(DLQ, 0)]
        plan.paused = [TopicPartition(DLQ, 0)]
        return plan


def tier_work(hub: FakeHub, topic: str) -> list[tuple[str, Any]]:
    return [(op, what) for op, what in hub.tiers.ran if what[0] == topic]


def dlq_on_the_consumer(hub: FakeHub) -> tuple[int | None, bool]:
    """Where the tiers consumer reads partition 0 of the DLQ from (None: not assigned), and
    whether it is paused, from what ran on it."""
    start, paused = None, False
    for op, what in tier_work(hub, DLQ):
        if op == "assign":
            start, paused = what[2], False
        elif op == "unassign":
            start = None
        elif op in ("pause", "resume"):
            paused = op == "pause"
    return start, paused


def test_a_tier_partition_with_nothing_to_read_is_fetched_only_once_a_copy_is_written() -> None:
    async def scenario() -> None:
        hub, offsets = FakeHub(), FakeOffsets()
        view = view_of(hub, offsets, IdleTiersRunner())
        # Taken over: the retry tier with records is assigned, the empty DLQ is not
        await view.take_over([0])
        assert ("assign", (RQ1, 0, -2)) in hub.tiers.ran
        assert tier_work(hub, DLQ) == []
        # The runner resumes and pauses it again: nothing runs on the consumer
        view.post(lambda c: c.resume([TopicPartition(DLQ, 0)]))
        view.post(lambda c: c.pause([TopicPartition(DLQ, 0)]))
        assert tier_work(hub, DLQ) == []
        # A copy written there: assigned from where its reading starts, paused as asked
        view.copied(DLQ, 0)
        assert dlq_on_the_consumer(hub) == (-2, True)
        # From then on its commands run as any tier's; a second copy assigns nothing again
        ran = len(hub.tiers.ran)
        view.copied(DLQ, 0)
        view.post(lambda c: c.resume([TopicPartition(DLQ, 0)]))
        assert hub.tiers.ran[ran:] == [("resume", (DLQ, 0))]
        # Its records now reach the runner
        assert (DLQ, 0) in view._tier_live

    asyncio.run(scenario())


def test_a_seek_wakes_a_dormant_tier_partition_at_its_offset_and_then_follows() -> None:
    async def scenario() -> None:
        hub, offsets = FakeHub(), FakeOffsets()
        view = view_of(hub, offsets, IdleTiersRunner())
        await view.take_over([0])
        # An operator's release: the runner seeks the DLQ back to a dead letter
        after: list[str] = []
        view.post(lambda c: c.seek(TopicPartition(DLQ, 0, 3)), lambda: after.append("then"))
        # Assigned at the sought offset (paused as it was asked), then the callback runs
        assert dlq_on_the_consumer(hub) == (3, True)
        for _ in range(50):
            if after:
                break
            await asyncio.sleep(0.01)
        assert after == ["then"]

    asyncio.run(scenario())


def test_giving_up_a_dormant_tier_partition_unassigns_only_what_was_assigned() -> None:
    async def scenario() -> None:
        hub, offsets = FakeHub(), FakeOffsets()
        view = view_of(hub, offsets, IdleTiersRunner())
        await view.take_over([0])
        await view.give_up([0])
        unassigned = [what for op, what in hub.tiers.ran if op == "unassign"]
        assert unassigned == [(RQ1, 0)]
        # Taken over again, it starts from its own plan, not the last one's
        await view.take_over([0])
        assert dlq_on_the_consumer(hub) == (None, False)
        view.copied(DLQ, 0)
        assert dlq_on_the_consumer(hub) == (-2, True)

    asyncio.run(scenario())


def test_the_live_reader_starts_without_waiting_for_a_slow_takeover_which_joins_it_later(
    monkeypatch: Any,
) -> None:
    """A worker assigned main partitions with hundreds of subscriptions to take over read
    none of them for a minute: the assignment waited for every takeover."""
    from delivery.readers import ReaderHub

    monkeypatch.setattr("delivery.readers.TAKEOVER_WAIT_S", 0.1)

    async def scenario() -> None:
        hub = ReaderHub(
            lambda group: {},
            lambda topic, partition: 0,
            "setu.delivery",
            end_offset=lambda t, p: 40,
        )
        hub.membership, hub.catch_up = FakeReader(), FakeReader()  # type: ignore[assignment]
        hub.tiers = FakeTiers()  # type: ignore[assignment]
        # Given a subscription whose takeover waits (its offsets are slow to come)
        offsets = GatedOffsets()
        view = view_of(hub, offsets)
        # When the worker is assigned main partition 0
        starts = await asyncio.wait_for(hub._main_assigned([TopicPartition(MAIN, 0)]), 5)
        # Then the live reader starts at once, from the partition's end
        assert [(tp.topic, tp.partition, tp.offset) for tp in starts] == [(MAIN, 0, 40)]
        # And the takeover, once done, adds the subscription's cursor at its own offset
        offsets.gate.set()
        for _ in range(100):
            if view.key in hub._owned[(MAIN, 0)]:
                break
            await asyncio.sleep(0.01)
        assert view.key in hub._owned[(MAIN, 0)]
        await hub.close()

    asyncio.run(scenario())
