"""Scenarios of one partition's delivery, step by step (see sim.World for the rules)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from setu.envelope import Envelope
from setu.model import DeadLetterPolicy, Subscription
from setu.ordering.groups import Kind
from setu.ordering.records import copy_headers, parse_record
from setu.ordering.state import Fenced
from setu.ordering.tiers import DLQ, MAIN
from setu.outcome import classify_status
from setu.policies import Policies, parse_filter
from tests.unit.delivery.sim import World, run, subscription


def kinds(world: World, tier: int) -> list[tuple[str, str]]:
    """(message id, kind) of every copy in ``tier``."""
    out = []
    for offset, raw in enumerate(world.logs[tier]):
        rec = parse_record(tier, offset, *raw)
        out.append((rec.message_id, str(rec.kind)))
    return out


def in_flight(world: World) -> list[str]:
    return [a.record.message_id for a in world.effects.dispatches]


def settle(world: World) -> None:
    """Completes every pending Kafka and Redis write."""
    while world.effects.moves or world.effects.persists:
        while world.effects.moves:
            world.finish_move(0)
        while world.effects.persists:
            world.finish_persist(0)


def poll_all(world: World) -> None:
    for tier in world.tiers:
        while world.poll(tier):
            pass


def answer_all(world: World, answers: dict[str, int]) -> None:
    """Answers every due call by group (200 unless listed) and settles what follows."""
    while world.answerable():
        attempt = world.effects.dispatches[world.answerable()[0]]
        world.respond(world.answerable()[0], answers.get(attempt.record.group or "", 200))
        settle(world)


def test_a_group_has_one_message_in_flight_and_groups_run_in_parallel() -> None:
    # Given three messages of g1 and one of g2
    world = World(subscription())
    for group in ("g1", "g1", "g1", "g2"):
        world.publish(group)
    # When the main log is read
    poll_all(world)
    # Then only g1's first message and g2's message are in flight
    assert in_flight(world) == ["g1-1", "g2-4"]
    # And g1's next message goes out only after its first is delivered
    world.respond(0, 200)
    assert in_flight(world) == ["g2-4", "g1-2"]


def test_a_failing_group_parks_its_later_messages_and_a_healthy_group_goes_on() -> None:
    # Given g1 failing with 503 and g2 healthy
    world = World(subscription())
    for group in ("g1", "g1", "g2", "g1", "g2"):
        world.publish(group)
    poll_all(world)
    answer_all(world, {"g1": 503})
    poll_all(world)
    answer_all(world, {"g1": 503})
    # Then g2 is delivered in full while g1's head waits in rq.1 with the rest parked behind it
    assert world.first["g2"] == ["g2-3", "g2-5"]
    assert world.first["g1"] == []
    assert kinds(world, 1) == [("g1-1", "head"), ("g1-2", "park"), ("g1-4", "park")]
    state = world.store.groups["g1"][1]
    assert (state.head, state.counts[1]) == ("g1-1", 3)
    # And the main log is committable to its end (parked counts as finished)
    assert world.engine.committable()[MAIN] == 5


def test_a_retry_is_held_until_due_and_then_delivered_in_order() -> None:
    # Given g1's first message failed once
    world = World(subscription(delays=(100, 300)))
    world.publish("g1")
    world.publish("g1")
    poll_all(world)
    answer_all(world, {"g1": 500})
    poll_all(world)
    # When rq.1 is read before the delay has passed
    assert world.paused == {1: (world.now + 105, 0)}  # 100 ms + 5% jitter (rnd 0.5)
    assert in_flight(world) == []
    # Then after the delay the head goes out, and the parked message right after it
    world.tick(105)
    poll_all(world)
    answer_all(world, {})
    poll_all(world)
    answer_all(world, {})
    assert world.first["g1"] == ["g1-1", "g1-2"]
    assert not world.store.groups


def test_retry_after_longer_than_the_tier_delay_is_honoured() -> None:
    world = World(subscription(delays=(100, 300)))
    world.publish("g1")
    poll_all(world)
    attempt = world.effects.dispatches.pop()
    from setu.outcome import classify_status

    world.engine.on_result(attempt, classify_status(429, world.sub.retry, "2", world.now))
    settle(world)
    copy = parse_record(1, 0, *world.logs[1][0])
    assert copy.due_at_ms == world.now + 2_000


def test_a_new_message_of_a_group_whose_head_moved_up_queues_behind_the_leftovers() -> None:
    # Given g1's head failed twice (now in rq.2) while its next message still sits in rq.1
    world = World(subscription(delays=(100, 300)))
    world.publish("g1")
    world.publish("g1")
    poll_all(world)
    answer_all(world, {"g1": 500})  # g1-1 -> rq.1
    world.poll(MAIN)  # g1-2 parks in rq.1
    settle(world)
    world.tick(200)
    world.poll(1)  # g1-1 is due: attempted again
    answer_all(world, {"g1": 500})  # g1-1 -> rq.2; g1-2 is still unread in rq.1
    # When a third message arrives
    world.publish("g1")
    world.poll(MAIN)
    settle(world)
    # Then it parks in the lowest tier holding the group (rq.1, behind g1-2), not with the head
    assert kinds(world, 1)[-1] == ("g1-3", "park")
    assert [m for m, _ in kinds(world, 2)] == ["g1-1"]
    # And healing the webhook delivers all three in published order
    world.drain()
    assert world.first["g1"] == ["g1-1", "g1-2", "g1-3"]


def test_a_leftover_is_forwarded_to_the_next_tier_holding_its_group_not_to_the_head() -> None:
    # Given three tiers, g1's head in rq.3, g1-2 forwarded to rq.2 and g1-3 still in rq.1
    world = World(subscription(delays=(10, 10, 10)))
    for _ in range(3):
        world.publish("g1")
    poll_all(world)
    answer_all(world, {"g1": 500})  # g1-1 -> rq.1
    world.poll(MAIN)
    world.poll(MAIN)
    settle(world)  # g1-2, g1-3 park in rq.1
    world.tick(50)
    world.poll(1)  # g1-1 attempted
    answer_all(world, {"g1": 500})  # g1-1 -> rq.2
    world.poll(1)  # g1-2 forwarded to rq.2
    settle(world)
    world.tick(50)
    world.poll(2)  # g1-1 attempted
    answer_all(world, {"g1": 500})  # g1-1 -> rq.3
    # When rq.1 reaches g1-3
    world.poll(1)
    settle(world)
    # Then it follows g1-2 into rq.2, so it cannot overtake it
    assert [m for m, _ in kinds(world, 2)] == ["g1-1", "g1-2", "g1-3"]
    assert [m for m, _ in kinds(world, 3)] == ["g1-1"]
    world.drain()
    assert world.first["g1"] == ["g1-1", "g1-2", "g1-3"]


def test_a_4xx_dead_letters_at_once_and_parks_the_group_until_unsidelined() -> None:
    # Given g1 answering 400 and two more messages behind it
    world = World(subscription())
    for _ in range(3):
        world.publish("g1")
    poll_all(world)
    answer_all(world, {"g1": 400})
    poll_all(world)
    settle(world)
    poll_all(world)
    # Then the first goes straight to the DLQ and the rest are parked behind it, unattempted
    assert kinds(world, DLQ) == [("g1-1", "head"), ("g1-2", "park"), ("g1-3", "park")]
    assert kinds(world, 1) == []
    assert world.raw == []
    state = world.store.groups["g1"][1]
    assert (state.head_tier, state.counts[DLQ], state.released) == (DLQ, 3, False)
    # When an operator unsidelines the group and the endpoint answers again
    world.release("g1")
    settle(world)
    poll_all(world)
    answer_all(world, {})
    poll_all(world)
    answer_all(world, {})
    poll_all(world)
    answer_all(world, {})
    # Then the dead letters are delivered in order and the group is healthy again
    assert world.first["g1"] == ["g1-1", "g1-2", "g1-3"]
    assert not world.store.groups
    # And nothing is kept per delivered letter: the group's state said which were live
    assert run(world.store.redelivered(0)) == set()


def test_an_unsidelined_letter_failing_again_reparks_the_group_on_it() -> None:
    world = World(subscription(delays=(10,)))
    for _ in range(2):
        world.publish("g1")
    poll_all(world)
    answer_all(world, {"g1": 400})
    poll_all(world)
    settle(world)
    world.release("g1")
    settle(world)
    poll_all(world)
    answer_all(world, {"g1": 400})  # the released head fails again
    state = world.store.groups["g1"][1]
    assert (state.released, state.head, state.counts[DLQ]) == (False, "g1-1", 2)


def test_under_skip_a_dead_letter_does_not_hold_its_group() -> None:
    # Given the skip policy and g1's first message answered with 400
    world = World(subscription(policy=DeadLetterPolicy.SKIP))
    for _ in range(3):
        world.publish("g1")
    poll_all(world)
    world.respond(0, 400)
    settle(world)
    # Then the next messages are delivered and the dead letter stands on its own
    answer_all(world, {})
    poll_all(world)
    answer_all(world, {})
    poll_all(world)
    answer_all(world, {})
    assert world.first["g1"] == ["g1-2", "g1-3"]
    assert kinds(world, DLQ) == [("g1-1", "skip")]
    assert not world.store.groups


def test_a_crash_between_the_kafka_ack_and_the_redis_write_is_completed_on_restart() -> None:
    # Given g1's head moved to rq.1 in Kafka but the Redis write never happened
    world = World(subscription())
    world.publish("g1")
    world.publish("g1")
    poll_all(world)
    world.respond(len(world.effects.dispatches) - 1, 500)
    world.finish_move(0)
    assert world.effects.persists  # not applied
    # When the worker crashes and restarts
    world.crash()
    # Then recovery recorded the move, so the replayed main record is not copied again
    assert world.store.groups["g1"][1].counts[1] == 1
    poll_all(world)
    settle(world)
    assert [m for m, _ in kinds(world, 1)] == ["g1-1", "g1-2"]
    world.drain()
    assert world.first["g1"] == ["g1-1", "g1-2"]
    assert len(world.raw) == 2


def test_a_replay_after_a_crash_skips_recorded_deliveries() -> None:
    # Given two messages delivered and recorded, but the offsets never committed
    world = World(subscription())
    world.publish("g1")
    world.publish("g2")
    poll_all(world)
    answer_all(world, {})
    world.flush()
    # When the worker crashes and reads the main log again
    world.crash()
    poll_all(world)
    # Then no webhook call is repeated
    assert in_flight(world) == []
    assert world.engine.committable()[MAIN] == 2


def test_an_ungrouped_subscription_sends_everything_at_once() -> None:
    world = World(subscription(grouped=False))
    for group in ("g1", "g1", "g1"):
        world.publish(group)
    poll_all(world)
    assert in_flight(world) == ["g1-1", "g1-2", "g1-3"]
    answer_all(world, {"g1": 400})
    assert kinds(world, DLQ) == [("g1-1", "dead"), ("g1-2", "dead"), ("g1-3", "dead")]


def test_single_dead_letters_are_delivered_again_on_request() -> None:
    world = World(subscription(grouped=False))
    world.publish(None)
    poll_all(world)
    answer_all(world, {"": 400})
    world.release_loose()
    poll_all(world)
    answer_all(world, {})
    assert world.first[""] == ["m-1"]
    assert run(world.store.redelivered(0)) == {0}
    assert run(world.store.poll_releases(0)) == (set(), set())
    assert Kind.DEAD.value == kinds(world, DLQ)[0][1]


def park_three_behind_a_400(world: World) -> None:
    """g1's first message dead-lettered by a 400, two more parked behind it in the DLQ."""
    for _ in range(3):
        world.publish("g1")
    poll_all(world)
    answer_all(world, {"g1": 400})
    poll_all(world)
    settle(world)
    poll_all(world)


def attempt_numbers(world: World) -> list[tuple[str, int]]:
    return [(a.record.message_id, a.number) for a in world.effects.dispatches]


def test_a_released_head_failing_again_goes_through_the_tiers_and_parks_its_group_again() -> None:
    # Given g1 parked in the DLQ behind its first message, released by an operator
    world = World(subscription(delays=(10, 20)))
    park_three_behind_a_400(world)
    world.release("g1")
    settle(world)
    poll_all(world)
    assert attempt_numbers(world) == [("g1-1", 2)]
    # When the released head fails with a retryable status
    answer_all(world, {"g1": 503})
    # Then its copy goes to rq.1 on a lap; the group is retrying there, not released
    assert kinds(world, 1) == [("g1-1", "lap")]
    state = world.store.groups["g1"][1]
    assert (state.lap, state.head, state.released, state.counts[DLQ]) == (1, "g1-1", False, 3)
    # When the copy fails in rq.1 and in rq.2 as well
    world.tick(50)
    poll_all(world)
    assert attempt_numbers(world) == [("g1-1", 3)]
    answer_all(world, {"g1": 503})
    assert kinds(world, 2) == [("g1-1", "lap")]
    world.tick(50)
    poll_all(world)
    assert attempt_numbers(world) == [("g1-1", 4)]
    answer_all(world, {"g1": 503})
    # Then the group parks on the same letter again, its latest failure recorded
    state = world.store.groups["g1"][1]
    assert (state.lap, state.head, state.released, state.dlq_from) == (0, "g1-1", False, 0)
    assert (state.attempts, state.last_status, state.counts[DLQ]) == (4, 503, 3)
    assert [m for m, _ in kinds(world, DLQ)] == ["g1-1", "g1-2", "g1-3"]  # no new letter
    assert world.raw == []  # nothing behind it was attempted
    # When it is released again and the endpoint answers
    world.release("g1")
    settle(world)
    poll_all(world)
    # Then the attempt count goes on, and the letters are delivered in order
    assert attempt_numbers(world) == [("g1-1", 5)]
    world.drain()
    assert world.first["g1"] == ["g1-1", "g1-2", "g1-3"]
    assert len(world.raw) == 3


def test_a_head_delivered_on_its_lap_releases_the_rest_in_order() -> None:
    # Given g1's released head on a lap in rq.1
    world = World(subscription(delays=(10, 20)))
    park_three_behind_a_400(world)
    world.release("g1")
    settle(world)
    poll_all(world)
    answer_all(world, {"g1": 500})
    # When a new message of g1 arrives meanwhile
    world.publish("g1")
    poll_all(world)
    settle(world)
    # Then it parks in the DLQ behind the group's letters
    assert kinds(world, DLQ)[-1] == ("g1-4", "park")
    assert world.raw == []
    # When the lap's copy is delivered
    world.tick(50)
    poll_all(world)
    answer_all(world, {})
    # Then the rest follow from the DLQ, in order, and the group is healthy again
    for _ in range(3):
        poll_all(world)
        answer_all(world, {})
    assert world.first["g1"] == ["g1-1", "g1-2", "g1-3", "g1-4"]
    assert not world.store.groups


def test_a_crash_between_a_lap_copy_and_its_redis_write_is_completed_on_restart() -> None:
    # Given a released head whose lap copy is in rq.1 but whose state change never happened
    world = World(subscription(delays=(10, 20)))
    park_three_behind_a_400(world)
    world.release("g1")
    settle(world)
    poll_all(world)
    world.respond(0, 503)
    world.finish_move(0)
    assert world.effects.persists
    # When the worker crashes and restarts
    world.crash()
    # Then recovery started the lap, so the letter is not attempted again from the DLQ
    state = world.store.groups["g1"][1]
    assert (state.lap, state.head, state.attempts) == (1, "g1-1", 2)
    poll_all(world)
    assert in_flight(world) == []
    world.drain()
    assert world.first["g1"] == ["g1-1", "g1-2", "g1-3"]
    assert len(world.raw) == 3


def test_a_single_dead_letter_failing_again_goes_through_the_tiers_back_to_the_dlq() -> None:
    # Given an ungrouped dead letter delivered again on request
    world = World(subscription(grouped=False, delays=(10, 20)))
    world.publish(None)
    poll_all(world)
    answer_all(world, {"": 400})
    world.release_loose()
    poll_all(world)
    # When it fails again, in the DLQ, then in rq.1 and rq.2
    answer_all(world, {"": 500})
    assert kinds(world, 1) == [("m-1", "retry")]
    assert run(world.store.redelivered(0)) == {0}  # the old letter is finished
    for tier in (1, 2):
        world.tick(50)
        poll_all(world)
        answer_all(world, {"": 500})
        assert [m for m, _ in kinds(world, tier)] == ["m-1"]
    # Then it is a dead letter again, with every attempt counted
    letters = world.dead_letters()
    assert [(r.message_id, str(r.kind), r.envelope.attempt) for r in letters] == [
        ("m-1", "dead", 1),
        ("m-1", "dead", 4),
    ]
    assert run(world.store.poll_releases(0)) == (set(), set())


def test_a_crash_after_a_single_letter_is_copied_out_does_not_copy_it_twice() -> None:
    # Given a released single letter copied to rq.1 whose Redis write never happened
    world = World(subscription(grouped=False, delays=(10, 20)))
    world.publish(None)
    poll_all(world)
    answer_all(world, {"": 400})
    world.release_loose()
    poll_all(world)
    world.respond(0, 500)
    world.finish_move(0)
    # When the worker crashes and restarts
    world.crash()
    # Then the letter is finished and not pending any more: it is not attempted again
    assert run(world.store.poll_releases(0)) == (set(), set())
    assert run(world.store.redelivered(0)) == {0}
    poll_all(world)
    assert in_flight(world) == []
    world.drain()
    assert world.raw == [("", "m-1")]


def test_copies_of_a_worker_that_lost_the_partition_are_ignored() -> None:
    # Given a worker calling g1's first message
    world = World(subscription(delays=(10, 20)))
    world.publish("g1")
    world.publish("g1")
    poll_all(world)
    stale_engine, stale_effects, stale_epoch = world.engine, world.effects, world.epoch
    # When it stalls, another worker takes the partition over, and the stalled one wakes up,
    # sees a 500 and writes its copy to rq.1
    world.crash()
    attempt = stale_effects.dispatches.pop()
    stale_engine.on_result(attempt, classify_status(500, world.sub.retry))
    move = stale_effects.moves.pop()
    offsets = []
    for copy in move.copies:
        offsets.append(len(world.logs[1]))
        headers = copy_headers(copy.envelope, copy.kind, copy.origin, copy.due_at_ms, stale_epoch)
        world.logs[1].append((headers, copy.envelope.body))
    # Then its Redis write is refused
    with pytest.raises(Fenced):
        run(world.store.apply(stale_engine.moved(move, offsets).write, stale_epoch))
    # And the new owner delivers the message itself and skips the stale copy
    world.drain()
    assert world.engine.stale_copies == 1
    assert world.first["g1"] == ["g1-1", "g1-2"]
    assert world.raw == [("g1", "g1-1"), ("g1", "g1-2")]
    assert not world.store.groups


def from_ingest(world: World, group: str, ingest_offset: int, log: str | None = None) -> str:
    """Appends to the main log what the ingest job writes for ingest partition 0's record at
    ``ingest_offset`` (of the shared ingest log ``log``, if given, else of the topic's own
    ingest topic); the same offset again is a replayed batch's copy (same id, same bytes)."""
    message_id = f"{group}-{log or 'i'}{ingest_offset}"
    envelope = Envelope(
        message_id,
        message_id.encode(),
        group_id=group,
        ingest_partition=0,
        ingest_offset=ingest_offset,
        ingest_log=log,
    )
    world.logs[MAIN].append((envelope.kafka_headers(), envelope.body))
    if message_id not in world.published[group]:
        world.published[group].append(message_id)
    return message_id


def test_a_batch_the_ingest_job_wrote_twice_is_called_once() -> None:
    # Given ingest offsets 0..3 in the main log, then a replayed batch holding 1..3 again, then 4
    world = World(subscription(delays=(10, 20)))
    for offset, group in enumerate(("g1", "g2", "g1", "g2")):
        from_ingest(world, group, offset)
    for offset, group in ((1, "g2"), (2, "g1"), (3, "g2")):
        from_ingest(world, group, offset)
    from_ingest(world, "g1", 4)
    # When the worker reads it all while g2's endpoint fails for a while
    poll_all(world)
    answer_all(world, {"g2": 500})
    world.drain()
    # Then every message is called once, in order, and the copies only finish their offsets
    assert sorted(m for _, m in world.raw) == sorted({m for _, m in world.raw})
    assert world.first == {"g1": ["g1-i0", "g1-i2", "g1-i4"], "g2": ["g2-i1", "g2-i3"]}
    assert world.engine.replay_copies == 3
    assert world.engine.committable()[MAIN] == 8
    assert not world.store.groups


def test_records_from_the_shared_ingest_log_after_a_topics_own_are_not_taken_for_copies() -> None:
    # Given a main partition fed by its topic's ingest partition 0 up to offset 40, then (the
    # ingest log switched to the shared one) by the shared log's partition 0 from offset 3
    world = World(subscription(delays=(10,)))
    own = [from_ingest(world, "g1", offset) for offset in (38, 39, 40)]
    shared = [from_ingest(world, "g1", offset, log="setu.ingest") for offset in (3, 4)]
    # And a replayed batch of the shared log copying offset 4 again
    from_ingest(world, "g1", 4, log="setu.ingest")
    # When the worker reads it all
    poll_all(world)
    world.drain()
    # Then every message is called once, in order: lower offsets of another log are no copies
    assert world.first == {"g1": own + shared}
    assert world.engine.replay_copies == 1


def test_a_lap_copy_behind_a_leftover_in_its_tier_is_not_swept_along_with_it() -> None:
    # Given g1's head dead-lettered from rq.1 with g1-2 still unread behind it there, and a
    # restarted worker that releases g1 while the endpoint still fails
    world = World(subscription(delays=(10,)))
    world.publish("g1")
    world.publish("g1")
    world.poll(MAIN)
    answer_all(world, {"g1": 500})
    world.poll(MAIN)
    settle(world)
    world.tick(50)
    world.poll(1)
    answer_all(world, {"g1": 500})
    world.crash()
    world.release("g1")
    settle(world)
    world.poll(DLQ)
    world.respond(0, 500)  # the released head fails again: its lap copy is on its way
    # When rq.1 is read meanwhile (g1-2, then the lap copy) before the lap is recorded
    world.poll(1)
    world.poll(1)
    world.finish_move(0)
    world.tick(50)
    world.poll(1)
    world.finish_persist(0)
    settle(world)
    # Then only the leftover follows its group to the DLQ; the lap copy stays to be attempted
    assert kinds(world, DLQ) == [("g1-1", "head"), ("g1-2", "forward")]
    assert in_flight(world) == ["g1-1"]
    world.drain()
    assert world.first["g1"] == ["g1-1", "g1-2"]


def run_flaky(world: World, failures: int, rounds: int = 200) -> None:
    """Runs until nothing is left to do, with a webhook that fails each message's first
    ``failures`` calls with 503 and then answers 200."""
    for _ in range(rounds):
        settle(world)
        poll_all(world)
        while world.answerable():
            index = world.answerable()[0]
            calls = world.calls[world.effects.dispatches[index].record.message_id]
            world.respond(index, 503 if calls < failures else 200)
            settle(world)
            poll_all(world)
        if not world.busy() and not world.paused and not world.effects.dispatches:
            return
        world.tick(50)
    raise AssertionError("the world did not settle")


@pytest.mark.parametrize(
    ("delays", "failures"),
    [((300, 800), 2), ((100,), 1), ((100, 200, 300), 3), ((100, 200, 300), 2)],
)
def test_a_flaky_endpoint_dead_letters_nothing_when_every_message_has_attempts_to_spare(
    delays: tuple[int, ...], failures: int
) -> None:
    # Given a group of three messages and N retry tiers, and a webhook that fails every
    # message's first k <= N calls
    world = World(subscription(delays=delays))
    ids = [world.publish("g1") for _ in range(3)]
    # When it all runs
    run_flaky(world, failures)
    # Then every message is delivered, in order, each with its own attempts 1..k+1
    assert world.first["g1"] == ids
    assert {m: world.numbers[m] for m in ids} == {m: list(range(1, failures + 2)) for m in ids}
    assert world.logs[DLQ] == []
    assert not world.store.groups


def follower_heads_the_last_tier(world: World) -> None:
    """g1-1 delivered from rq.2 after two failures; g1-2, behind it there, now in flight."""
    world.publish("g1")
    world.publish("g1")
    poll_all(world)
    answer_all(world, {"g1": 503})  # g1-1 -> rq.1, g1-2 parks there
    poll_all(world)
    settle(world)
    world.tick(315)
    poll_all(world)
    answer_all(world, {"g1": 503})  # g1-1 -> rq.2, g1-2 forwarded behind it
    poll_all(world)
    settle(world)
    world.tick(840)
    poll_all(world)
    world.respond(0, 200)  # g1-1 delivered; g1-2 is the head in rq.2
    settle(world)
    assert in_flight(world) == ["g1-2"]


def test_a_follower_that_becomes_head_in_the_last_tier_waits_there_with_its_own_backoff() -> None:
    # Given g1-1 delivered from rq.2 after two failures, and g1-2 waiting behind it in rq.2
    world = World(subscription(delays=(300, 800)))
    follower_heads_the_last_tier(world)
    # When g1-2 fails its first call there
    failed_at = world.now
    world.respond(0, 503)
    settle(world)
    # Then it stays in rq.2 (no copy), due after rq.1's delay, the first of its attempts
    state = world.store.groups["g1"][1]
    assert (state.head, state.attempts, state.counts[2]) == ("g1-2", 1, 1)
    assert state.due_at_ms == failed_at + 315  # 300 ms + 5% jitter (rnd 0.5)
    assert [m for m, _ in kinds(world, 2)] == ["g1-1", "g1-2"]
    assert world.answerable() == []
    # And a worker that takes over goes on from its attempts and due time
    world.crash()
    poll_all(world)
    assert [(a.number, a.not_before_ms) for a in world.effects.dispatches] == [(2, failed_at + 315)]


def test_a_head_waiting_in_its_tier_honours_retry_after() -> None:
    from setu.outcome import classify_status

    # Given g1-2 the head in rq.2, in flight
    world = World(subscription(delays=(300, 800)))
    follower_heads_the_last_tier(world)
    # When it is answered 429 with Retry-After: 5
    failed_at = world.now
    attempt = world.effects.dispatches.pop()
    world.engine.on_result(attempt, classify_status(429, world.sub.retry, "5", failed_at))
    settle(world)
    # Then it waits in place for the 5 s the endpoint asked, not the tier's 300 ms
    state = world.store.groups["g1"][1]
    assert (state.head, state.attempts, state.due_at_ms) == ("g1-2", 1, failed_at + 5_000)


def test_a_group_released_again_after_a_failed_lap_is_delivered_after_a_crash() -> None:
    # Given a dead-lettered group released while its endpoint still failed: its head went on a
    # lap through every retry tier and parked again; nothing of the tiers is committed yet
    world = World(subscription(delays=(100, 200)))
    world.publish("g1")
    run_flaky(world, failures=3)
    world.release("g1")
    run_flaky(world, failures=6)
    assert world.store.groups["g1"][1].attempts == 6
    # When the group is released again and the worker crashes before the letter is delivered
    world.release("g1")
    settle(world)
    world.crash()
    # Then the earlier lap's copies are not taken for a lap in progress: it is delivered
    world.drain()
    assert world.first["g1"] == ["g1-1"]


class SeekRecorder:
    """Effects that only record the DLQ seeks an engine asks for."""

    def __init__(self) -> None:
        self.seeks: list[int] = []

    def seek(self, partition: int, tier: int, offset: int) -> None:
        assert tier == DLQ
        self.seeks.append(offset)

    def __getattr__(self, name: str) -> object:
        return lambda *args: None


def test_one_dlq_seek_at_a_time_so_a_late_one_cannot_skip_released_letters() -> None:
    from delivery.engine import PartitionEngine
    from setu.ordering.state import PartitionSnapshot

    # Given a DLQ read up to offset 30, and letters at 22 then at 5 released one after another
    effects = SeekRecorder()
    engine = PartitionEngine(
        subscription(),
        0,
        effects,  # type: ignore[arg-type]
        PartitionSnapshot(),
        clock=lambda: 0,
        rng=lambda: 0.5,
        positions={DLQ: 30},
    )
    engine.add_pending_releases([22])
    engine.add_pending_releases([5])
    # Then only the first seek is on its way: two in flight could land in either order (the
    # runner tries a refused seek again later), leaving the consumer at 22, past letter 5
    assert effects.seeks == [22]
    # When it lands, the lower one is sought, and only when that lands is the DLQ read again
    engine.unblocked(DLQ, 22)
    assert effects.seeks == [22, 5]
    assert DLQ in engine.blocked
    engine.unblocked(DLQ, 5)
    assert DLQ not in engine.blocked
    assert engine.trackers[DLQ].position == 5


def filtering(document: dict[str, object]) -> Subscription:
    return replace(subscription(), policies=Policies(filter=parse_filter(document)))


KEEP = (("X_KIND", "keep"),)
DROP = (("X-Kind", "drop"),)


def test_filtered_messages_are_never_called_and_never_wait_behind_a_failed_head() -> None:
    # Given a subscription that wants X_KIND=keep, and g1 = keep, drop, keep
    world = World(filtering({"header": "X_KIND", "equals": "keep"}))
    for headers in (KEEP, DROP, KEEP):
        world.publish("g1", headers=headers)
    # When g1's head fails
    poll_all(world)
    answer_all(world, {"g1": 503})
    # Then the unwanted message was counted, not called, and did not park behind the head
    assert world.effects.filtered_ids == ["g1-2"]
    assert kinds(world, 1) == [("g1-1", "head"), ("g1-3", "park")]
    world.commit()
    assert world.committed[MAIN] == 3
    # And once healed, the wanted ones arrive in order and the unwanted one never
    world.drain()
    assert world.first["g1"] == ["g1-1", "g1-3"]
    assert world.calls["g1-2"] == 0


def test_a_changed_filter_applies_from_the_next_message_on() -> None:
    # Given no filter and one message read
    world = World(subscription())
    world.publish("g1", headers=DROP)
    poll_all(world)
    # When a filter arrives and more messages come
    world.engine.sub = filtering({"not": {"header": "X_KIND", "equals": "drop"}})
    world.publish("g1", headers=DROP)
    world.publish("g1", headers=KEEP)
    poll_all(world)
    world.drain()
    # Then the message read before the change is still delivered, the later one is not
    assert world.first["g1"] == ["g1-1", "g1-3"]
    assert world.effects.filtered_ids == ["g1-2"]


def test_records_read_again_after_redis_forgot_their_outcomes_are_not_moved_twice() -> None:
    # Given g1 failed: its head moved up to rq.2 and two followers parked behind it in rq.1,
    # all recorded, nothing committed
    world = World(subscription(delays=(100, 300)))
    ids = [world.publish("g1") for _ in range(3)]
    poll_all(world)
    answer_all(world, {"g1": 500})
    world.tick(200)
    poll_all(world)
    answer_all(world, {"g1": 500})
    state = world.store.groups["g1"][1]
    assert (state.counts[1], state.counts[2]) == (0, 3)
    # When Redis forgets every recorded outcome and the partition is rebuilt
    world.redis_forgets()
    # Then the state is what the changelog held, and reading everything again moves nothing
    assert world.store.groups["g1"][1].counts == state.counts
    copies = {t: len(world.logs[t]) for t in world.tiers}
    poll_all(world)
    settle(world)
    assert {t: len(world.logs[t]) for t in world.tiers} == copies
    # And once the endpoint heals, g1 is delivered in order and healthy again
    world.drain()
    assert world.first["g1"] == ids
    assert "g1" not in world.store.groups


def test_a_group_that_healed_before_redis_forgot_is_not_held_by_its_old_copies() -> None:
    # Given g2 failed twice and healed each time, its copies still above the commits
    world = World(subscription(policy=DeadLetterPolicy.SKIP))
    first = world.publish("g2")
    poll_all(world)
    answer_all(world, {"g2": 500})
    world.tick(200)
    poll_all(world)
    answer_all(world, {})
    second = world.publish("g2")
    poll_all(world)
    answer_all(world, {"g2": 500})
    world.tick(200)
    poll_all(world)
    answer_all(world, {})
    assert world.first["g2"] == [first, second]
    assert "g2" not in world.store.groups
    # When Redis forgets the outcomes and the partition is rebuilt
    world.redis_forgets()
    # Then at most the newest copy is taken for a change to complete, and a new message of
    # g2 is delivered: nothing waits forever behind copies that were finished
    third = world.publish("g2")
    world.drain()
    assert world.first["g2"] == [first, second, third]
    assert "g2" not in world.store.groups


def test_a_group_that_healed_on_laps_and_parked_again_is_delivered_after_redis_forgets() -> None:
    # Given g2 dead-lettered and released while its endpoint failed each message twice: both
    # went on laps (g2-2's up to rq.2) and were delivered, g2 healed; nothing is committed
    world = World(subscription(delays=(100, 200)))
    ids = [world.publish("g2") for _ in range(2)]
    poll_all(world)
    answer_all(world, {"g2": 400})
    world.release("g2")
    run_flaky(world, failures=2)
    assert kinds(world, 2) == [("g2-2", "lap")]
    assert "g2" not in world.store.groups
    # And Redis forgot: g2's messages read again from the main log were answered 400, and g2
    # parked again on new letters
    world.redis_forgets()
    poll_all(world)
    answer_all(world, {"g2": 400})
    assert world.store.groups["g2"][1].head == "g2-1"
    # When Redis forgets again, and g2 gets a new message while its endpoint still answers 400
    world.redis_forgets()
    ids.append(world.publish("g2"))
    for _ in range(3):
        settle(world)
        poll_all(world)
        answer_all(world, {"g2": 400})
        world.tick(300)
    # Then g2-2's lap copy in rq.2, from before g2 healed, was not taken for a lap in progress:
    # g2 still parks on its first new letter
    state = world.store.groups["g2"][1]
    assert (state.head, state.dlq_from, state.lap) == ("g2-1", 2, 0)
    # And once released with the endpoint healed, g2 is delivered in order and healthy again
    world.drain()
    assert world.first["g2"] == ids
    assert "g2" not in world.store.groups


def test_a_copy_from_before_a_group_healed_is_not_forwarded_behind_its_held_head() -> None:
    # Given g1 failed once and healed (its head copy still in rq.1), then a g1 message
    # scheduled 5 s ahead, held, with a follower parked behind it in rq.1; nothing committed
    world = World(subscription(delays=(100, 200)))
    ids = [world.publish("g1")]
    poll_all(world)
    answer_all(world, {"g1": 503})
    world.tick(200)
    poll_all(world)
    answer_all(world, {})
    assert "g1" not in world.store.groups
    ids += [world.publish("g1", deliver_in_ms=5_000), world.publish("g1")]
    poll_all(world)
    settle(world)
    assert kinds(world, 1) == [("g1-1", "head"), ("g1-3", "park")]
    # When Redis forgets the outcomes and the partition is rebuilt, and the held head, due,
    # fails twice and moves up to rq.2 (its follower is forwarded there)
    world.redis_forgets()
    poll_all(world)
    world.tick(5_000)
    world.finish_recall(0)
    world.respond(0, 503)
    settle(world)
    world.tick(200)
    world.finish_recall(0)
    world.respond(0, 503)
    settle(world)
    # Then the old copy was known finished by g1's done marks: only the follower went along
    assert kinds(world, 2) == [("g1-2", "head"), ("g1-3", "forward")]
    state = world.store.groups["g1"][1]
    assert (state.counts[1], state.counts[2]) == (0, 2)
    # And g1 is delivered in order, its first message not called again
    world.drain()
    assert world.first["g1"] == ids
    assert world.calls["g1-1"] == 2
    assert "g1" not in world.store.groups


# Scheduled messages (docs/scheduling.md)


def held_then_due(sub: Subscription) -> World:
    """g1-1 scheduled 5 s ahead with g1-2 behind it, held; then due, read back and called."""
    world = World(sub)
    world.publish("g1", deliver_in_ms=5_000)
    world.publish("g1")
    poll_all(world)
    settle(world)
    world.tick(5_000)
    world.finish_recall(0)
    assert in_flight(world) == ["g1-1"]
    return world


def test_a_scheduled_message_is_held_by_reference_and_its_group_parks_behind_it() -> None:
    # Given g1's first message scheduled 10 s ahead, a second g1 message and a g2 message
    world = World(subscription(delays=(100, 200)))
    world.publish("g1", deliver_in_ms=10_000)
    world.publish("g1")
    world.publish("g2")
    poll_all(world)
    settle(world)
    # Then g2 is called at once; g1's head is held, its follower parked in rq.1
    assert in_flight(world) == ["g2-3"]
    state = world.store.groups["g1"][1]
    assert (state.head, state.held, state.counts[1]) == ("g1-1", 0, 2)
    assert kinds(world, 1) == [("g1-2", "park")]
    # And the main log's commit moves past the held message (nothing in memory holds it)
    answer_all(world, {})
    world.commit()
    assert world.committed[MAIN] == 3
    # When its time comes, it is read back and called, then its follower
    world.tick(10_000)
    assert world.effects.recalls and not world.effects.dispatches
    world.finish_recall(0)
    assert in_flight(world) == ["g1-1"]
    world.drain()
    assert world.first["g1"] == ["g1-1", "g1-2"]
    assert "g1" not in world.store.groups


def test_a_held_head_failing_again_moves_up_and_a_crash_before_its_redis_write_is_completed() -> (
    None
):
    # Given g1's scheduled head, due, fails once (it waits in place) and again (a head copy)
    world = held_then_due(subscription(delays=(100, 200)))
    world.respond(0, 503)
    settle(world)
    assert world.store.groups["g1"][1].held == 0  # waits in place, in the main log
    world.tick(200)
    world.finish_recall(0)
    world.respond(0, 503)
    world.finish_move(0)  # its copy is in rq.2, the state change not yet in Redis
    assert kinds(world, 2) == [("g1-1", "head")]
    # When the worker crashes and restarts
    world.crash()
    # Then recovery completed the move: the head counts in rq.2, no longer held
    state = world.store.groups["g1"][1]
    assert (state.held, state.counts[1], state.counts[2]) == (-1, 1, 1)
    # And the rest is delivered in order, the head called once per attempt (3 in all)
    world.drain()
    assert world.first["g1"] == ["g1-1", "g1-2"]
    assert world.numbers["g1-1"] == [1, 2, 3]


def test_a_cancelled_scheduled_message_is_never_called_and_its_group_goes_on() -> None:
    world = World(subscription())
    world.publish("g1", deliver_in_ms=5_000)
    world.publish("g1")
    poll_all(world)
    settle(world)
    world.cancel("g1-1")
    world.tick(5_000)
    world.finish_recall(0)
    settle(world)
    world.drain()
    assert world.calls["g1-1"] == 0
    assert world.first["g1"] == ["g1-2"]
    assert world.unscheduled == {"g1-1"}


def test_a_message_scheduled_within_a_second_is_called_at_its_time_without_being_held() -> None:
    world = World(subscription())
    world.publish("g1", deliver_in_ms=800)
    poll_all(world)
    assert not world.effects.persists and not world.store.groups
    assert world.effects.dispatches[0].not_before_ms == world.now + 800
    assert world.answerable() == []


def test_without_retry_tiers_a_held_head_that_fails_is_dead_lettered_at_once() -> None:
    world = held_then_due(subscription(delays=()))
    world.respond(0, 503)
    settle(world)
    assert kinds(world, DLQ) == [("g1-1", "head")]
    state = world.store.groups["g1"][1]
    assert (state.head_tier, state.held) == (DLQ, -1)
