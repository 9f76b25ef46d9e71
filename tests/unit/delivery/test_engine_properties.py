"""Hypothesis stateful tests of group delivery with crash-and-restart steps (docs/design.md §4).

The invariant, checked on every 2xx: per group, first deliveries follow the published order
minus dead-lettered messages (``skip``), and nothing after a parked message is delivered before
it (``park``). At the end the webhook heals, operators release everything, and every published
message must have been delivered; without a crash, no message may be delivered twice.

The webhook answers per group according to a mode the test flips (healthy, 5xx, 4xx, timeouts,
flaky); work advances in bursts of interleaved steps (poll a tier, answer a call, acknowledge a
Kafka write, apply a Redis write, let time pass) so runs reach deep retry and DLQ states, with
crashes between any two steps, and stalls: a worker loses the partition without noticing and
later finishes its calls and writes in progress (its copies must be ignored, its Redis writes
refused, and the invariant must hold all the same); and Redis forgetting: the partition is
rebuilt from the changelog without any recorded outcome, and the groups' done marks must
recognise what was finished.

Some messages are scheduled for later (docs/scheduling.md): none may be called before its time,
its group's later messages wait behind it, a producer may cancel it before it is called, and
nothing else changes; a cancelled message is left out of the order it would have held.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from setu.model import DeadLetterPolicy, Subscription
from setu.ordering.records import parse_record
from tests.unit.delivery.sim import World, subscription

GROUPS = ("g1", "g2", "g3")
# "fail1"/"fail2": each message fails its first one or two calls, then succeeds (an endpoint that
# is merely flaky: with a retry tier or more per failure, nothing of it may be dead-lettered)
MODES = ("ok", "500", "400", "timeout", "flaky", "fail1", "fail2")
STEPS = ("poll", "poll", "poll", "answer", "answer", "answer", "ack", "apply", "tick", "recall")


class Delivery(RuleBasedStateMachine):
    sub: Subscription
    park_first = False  # start with every group parked in the DLQ (to reach laps often)

    def __init__(self) -> None:
        super().__init__()
        self.world = World(self.sub)
        self.modes = dict.fromkeys(GROUPS, "ok")

    @initialize(
        modes=st.lists(st.sampled_from(MODES), min_size=len(GROUPS), max_size=len(GROUPS)),
        counts=st.lists(st.integers(0, 5), min_size=len(GROUPS), max_size=len(GROUPS)),
    )
    def start(self, modes: list[str], counts: list[int]) -> None:
        # Given some groups failing from the start, each with a few messages published
        self.modes = dict(zip(GROUPS, modes, strict=True))
        for group, n in zip(GROUPS, counts, strict=True):
            for _ in range(n):
                self.world.publish(group)
        if self.park_first:
            self.park_everything()

    def park_everything(self) -> None:
        """Drives every group with messages into the DLQ with 400s (then the modes apply)."""
        world = self.world
        for _ in range(20):
            for tier in world.tiers:
                while world.poll(tier):
                    pass
            if not (world.answerable() or world.effects.moves or world.effects.persists):
                break
            while world.answerable():
                world.respond(world.answerable()[0], 400)
            while world.effects.moves or world.effects.persists:
                if world.effects.moves:
                    world.finish_move(0)
                else:
                    world.finish_persist(0)

    @rule(group=st.sampled_from(GROUPS), n=st.integers(1, 4))
    def publish(self, group: str, n: int) -> None:
        for _ in range(n):
            self.world.publish(group)

    @rule(
        group=st.sampled_from(GROUPS),
        n=st.integers(1, 3),
        delay=st.sampled_from([30, 400, 5_000, 120_000]),
    )
    def publish_scheduled(self, group: str, n: int, delay: int) -> None:
        for _ in range(n):
            self.world.publish(group, deliver_in_ms=delay)

    @rule(data=st.data())
    def producer_cancels(self, data: st.DataObject) -> None:
        world = self.world
        waiting = sorted(m for m in world.scheduled if m not in world.delivered_ids)
        if waiting:
            world.cancel(data.draw(st.sampled_from(waiting)))

    @rule(group=st.sampled_from(GROUPS), mode=st.sampled_from(MODES))
    def webhook_changes(self, group: str, mode: str) -> None:
        self.modes[group] = mode

    @rule(data=st.data(), steps=st.integers(1, 25))
    def work(self, data: st.DataObject, steps: int) -> None:
        for _ in range(steps):
            self.step(data, data.draw(st.sampled_from(STEPS)))

    def step(self, data: st.DataObject, step: str) -> None:
        world = self.world
        if step == "poll":
            tier = data.draw(st.sampled_from(world.tiers))
            world.poll(tier)
        elif step == "answer" and world.answerable():
            index = data.draw(st.sampled_from(world.answerable()))
            rec = world.effects.dispatches[index].record
            mode = self.modes.get(rec.group or "", "ok")
            world.respond(index, self.answer(data, mode, world.calls[rec.message_id]))
        elif step == "ack" and world.effects.moves:
            world.finish_move(data.draw(st.integers(0, len(world.effects.moves) - 1)))
        elif step == "apply" and world.effects.persists:
            world.finish_persist(data.draw(st.integers(0, len(world.effects.persists) - 1)))
        elif step == "tick":
            world.tick(data.draw(st.sampled_from([5, 60, 200])))
        elif step == "recall" and world.effects.recalls:
            world.finish_recall(data.draw(st.integers(0, len(world.effects.recalls) - 1)))

    @rule(data=st.data())
    def everything_runs_its_course(self, data: st.DataObject) -> None:
        """Runs with the webhook as it is until nothing is left to do (retries fall due,
        groups reach their tiers or the DLQ): reaches deep states in one step."""
        world = self.world
        for _ in range(60):
            progressed = False
            for tier in world.tiers:
                while world.poll(tier):
                    progressed = True
            while world.answerable():
                rec = world.effects.dispatches[world.answerable()[0]].record
                mode = self.modes.get(rec.group or "", "ok")
                world.respond(
                    world.answerable()[0], self.answer(data, mode, world.calls[rec.message_id])
                )
                progressed = True
            progressed = world.complete_writes() or progressed
            if not progressed:
                if not (world.paused or world.effects.dispatches or world.engine.next_due_ms()):
                    return
                world.tick(world.next_wake())

    @staticmethod
    def answer(data: st.DataObject, mode: str, calls: int = 0) -> int | str:
        """The webhook's answer in ``mode`` to a message it was called for ``calls`` times."""
        if mode in ("fail1", "fail2"):
            return 503 if calls < int(mode[-1]) else 200
        if mode == "ok":
            return 200
        if mode == "500":
            return 500
        if mode == "400":
            return 400
        if mode == "timeout":
            return "timeout"
        flaky: list[int | str] = [200, 503, 429, 400, "timeout"]
        return data.draw(st.sampled_from(flaky))

    @rule()
    def commit(self) -> None:
        self.world.commit()

    @rule(ms=st.sampled_from([50, 150, 400]))
    def time_passes(self, ms: int) -> None:
        self.world.tick(ms)

    @rule(roll=st.integers(0, 3))
    def crash_and_restart(self, roll: int) -> None:
        if roll == 0:
            self.world.crash()

    @rule(roll=st.integers(0, 3))
    def redis_forgets_and_the_partition_is_rebuilt(self, roll: int) -> None:
        if roll == 0:
            self.world.redis_forgets()

    @rule(roll=st.integers(0, 3))
    def stall_and_lose_the_partition(self, roll: int) -> None:
        if roll == 0:
            self.world.stall()

    @rule(data=st.data(), steps=st.integers(1, 10))
    def stalled_worker_wakes_up(self, data: st.DataObject, steps: int) -> None:
        world = self.world
        for _ in range(steps):
            busy = [
                i
                for i, s in enumerate(world.stalled)
                if s.effects.dispatches or s.effects.moves or s.effects.persists
            ]
            if not busy:
                return
            which = data.draw(st.sampled_from(busy))
            effects = world.stalled[which].effects
            step = data.draw(st.sampled_from(["answer", "ack", "apply"]))
            if step == "answer" and effects.dispatches:
                index = data.draw(st.integers(0, len(effects.dispatches) - 1))
                rec = effects.dispatches[index].record
                mode = self.modes.get(rec.group or "", "ok")
                answer = self.answer(data, mode, world.calls[rec.message_id])
                world.stalled_respond(which, index, answer)
            elif step == "ack" and effects.moves:
                world.stalled_move(which, data.draw(st.integers(0, len(effects.moves) - 1)))
            elif step == "apply" and effects.persists:
                world.stalled_persist(which, data.draw(st.integers(0, len(effects.persists) - 1)))

    @rule(group=st.sampled_from(GROUPS))
    def unsideline_group(self, group: str) -> None:
        self.world.release(group)

    @rule(group=st.sampled_from(GROUPS), mode=st.sampled_from(["500", "timeout", "flaky"]))
    def unsideline_a_group_whose_endpoint_still_fails(self, group: str, mode: str) -> None:
        # Its released head fails again: it goes round the retry tiers on a lap
        self.modes[group] = mode
        self.world.release(group)

    @rule()
    def unsideline_single_dead_letters(self) -> None:
        self.world.release_loose()

    @invariant()
    def committed_offsets_stay_inside_their_logs(self) -> None:
        for tier, offset in self.world.committed.items():
            assert 0 <= offset <= len(self.world.logs[tier])

    @invariant()
    def every_copy_keeps_its_partition_key(self) -> None:
        for tier in self.world.tiers:
            for offset, raw in enumerate(self.world.logs[tier][-3:]):
                rec = parse_record(tier, offset, *raw)
                assert rec.envelope.key == (rec.group or rec.message_id).encode()

    def teardown(self) -> None:
        world = self.world
        world.drain()
        for group, ids in world.published.items():
            missing = [
                m for m in ids if m not in world.delivered_ids and m not in world.unscheduled
            ]
            assert not missing, f"{group}: never delivered {missing}"
        assert not world.store.groups, "a group is still failed after everything was delivered"
        if world.crashes == 0:
            assert len(world.raw) == len({m for _, m in world.raw}), "a duplicate without a crash"


SETTINGS = settings(
    max_examples=120,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


class GroupedParkDelivery(Delivery):
    sub = subscription(grouped=True, policy=DeadLetterPolicy.PARK, delays=(100, 200, 300))


class GroupedReleasedDelivery(Delivery):
    """Groups start parked in the DLQ: releases, laps and reparks happen in most runs."""

    sub = subscription(grouped=True, policy=DeadLetterPolicy.PARK, delays=(100, 200))
    park_first = True


class GroupedSkipDelivery(Delivery):
    sub = subscription(grouped=True, policy=DeadLetterPolicy.SKIP)


class GroupedOneTierDelivery(Delivery):
    sub = subscription(grouped=True, policy=DeadLetterPolicy.PARK, delays=(100,))


class GroupedNoTierDelivery(Delivery):
    sub = subscription(grouped=True, policy=DeadLetterPolicy.PARK, delays=())


class UngroupedDelivery(Delivery):
    sub = subscription(grouped=False)


TestGroupedPark = GroupedParkDelivery.TestCase
TestGroupedPark.settings = SETTINGS
TestGroupedReleased = GroupedReleasedDelivery.TestCase
TestGroupedReleased.settings = SETTINGS
TestGroupedSkip = GroupedSkipDelivery.TestCase
TestGroupedSkip.settings = SETTINGS
TestGroupedOneTier = GroupedOneTierDelivery.TestCase
TestGroupedOneTier.settings = SETTINGS
TestGroupedNoTier = GroupedNoTierDelivery.TestCase
TestGroupedNoTier.settings = SETTINGS
TestUngrouped = UngroupedDelivery.TestCase
TestUngrouped.settings = SETTINGS
