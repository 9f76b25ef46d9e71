"""Delivery end to end on the real broker and Redis, against a real webhook receiver."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from setu.model import DeadLetterPolicy
from tests.integration.delivery.conftest import Receiver, ThreadWorker, World, wait_for

pytestmark = pytest.mark.integration


def test_messages_of_a_group_arrive_in_order_across_retries(
    world: World, receiver: Receiver, start_worker: Callable[..., ThreadWorker]
) -> None:
    # Given a grouped subscription whose endpoint fails g2's first two calls with 503
    world.topic("t")
    world.subscription(receiver.url, delays_ms=(100, 200))
    receiver.answer("g2", 503, 503, 200)
    ids = {g: world.publish("t", g, 5) for g in ("g1", "g2", "g3")}
    # When a worker runs
    start_worker()
    # Then every group is delivered completely and in published order
    wait_for(
        "every group delivered in order",
        lambda: all(receiver.delivered(g) == published for g, published in ids.items()),
    )
    # And g2's first message went through two retry tiers (attempts 1, 2, 3)
    assert [c.attempt for c in receiver.attempts(ids["g2"][0])] == [1, 2, 3]


def group_state(world: World, group: str, sub: str = "s") -> dict[str, str]:
    from state import keys

    client = world.redis()
    try:
        raw = client.hgetall(keys.group_state(world.project, sub, group))
        return {k.decode(): v.decode() for k, v in raw.items()}
    finally:
        client.close()


def dlq_count(state: dict[str, str]) -> int:
    return int(state["counts"].split(",")[-1]) if state else 0


def request_release(world: World, group: str, partitions: int = 2, sub: str = "s") -> None:
    from setu.partitioner import partition_for
    from state import keys

    client = world.redis()
    try:
        partition = partition_for(group.encode(), partitions)
        client.sadd(keys.release_requests(world.project, sub, partition), group)
    finally:
        client.close()


def test_a_4xx_dead_letters_at_once_parks_the_group_and_unsideline_restores_order(
    world: World, receiver: Receiver, start_worker: Callable[..., ThreadWorker]
) -> None:
    # Given g1's endpoint answering 400 and a healthy g2
    world.topic("t")
    world.subscription(receiver.url, delays_ms=(100, 200))
    receiver.answer("g1", 400)
    g1 = world.publish("t", "g1", 4)
    g2 = world.publish("t", "g2", 3)
    start_worker()
    # Then g1's first message is dead-lettered after one call and the rest park behind it
    wait_for("g2 delivered", lambda: receiver.delivered("g2") == g2)
    wait_for("g1 parked", lambda: dlq_count(group_state(world, "g1")) == 4)
    assert [c.attempt for c in receiver.attempts(g1[0])] == [1]
    assert all(receiver.attempts(m) == [] for m in g1[1:])
    # When the endpoint is fixed and an operator unsidelines g1
    receiver.heal()
    request_release(world, "g1")
    # Then g1's messages arrive in published order and the group is healthy again
    wait_for("g1 delivered", lambda: receiver.delivered("g1") == g1)
    wait_for("g1 healthy", lambda: group_state(world, "g1") == {})


def test_5xx_goes_through_every_retry_tier_to_the_dlq(
    world: World, receiver: Receiver, start_worker: Callable[..., ThreadWorker]
) -> None:
    # Given an endpoint that always answers 500 for g1, and two retry tiers
    world.topic("t")
    world.subscription(receiver.url, delays_ms=(150, 300))
    receiver.answer("g1", 500)
    [message] = world.publish("t", "g1", 1)
    start_worker()
    # Then the message is tried once per tier and then parks its group in the DLQ
    wait_for("dead-lettered", lambda: dlq_count(group_state(world, "g1")) == 1, 30)
    calls = receiver.attempts(message)
    assert [c.attempt for c in calls] == [1, 2, 3]
    # And each retry waited at least its tier's delay
    assert calls[1].at - calls[0].at >= 0.15
    assert calls[2].at - calls[1].at >= 0.3


def test_under_skip_a_dead_letter_does_not_stop_its_group(
    world: World, receiver: Receiver, start_worker: Callable[..., ThreadWorker]
) -> None:
    # Given the skip policy and g1's endpoint rejecting only its first message
    world.topic("t")
    world.subscription(receiver.url, delays_ms=(100,), policy=DeadLetterPolicy.SKIP)
    g1 = world.publish("t", "g1", 4)
    receiver.rules["g1"] = lambda: 200
    first = g1[0]

    def answer() -> int:
        with_first = [c for c in receiver.calls if c.message_id == first]
        return 400 if not with_first else 200

    receiver.rules["g1"] = answer
    start_worker()
    # Then the rest of g1 is delivered in order and no group state is left
    wait_for("g1 rest delivered", lambda: receiver.delivered("g1") == g1[1:])
    assert group_state(world, "g1") == {}


def test_a_healthy_group_is_not_slowed_by_a_failing_one(
    world: World, receiver: Receiver, start_worker: Callable[..., ThreadWorker]
) -> None:
    # Given one group that keeps failing with long retry delays, on the same partition count
    world.topic("t", partitions=1)
    world.subscription(receiver.url, delays_ms=(60_000,))
    receiver.answer("bad", 503)
    bad = world.publish("t", "bad", 20)
    good = world.publish("t", "good", 50)
    start_worker()
    # Then every message of the healthy group is delivered, in order, while the bad group waits
    wait_for("good delivered", lambda: receiver.delivered("good") == good, 20)
    assert receiver.delivered("bad") == []
    assert len(receiver.attempts(bad[0])) == 1
    state = group_state(world, "bad")
    assert state["head"] == bad[0]
    assert state["counts"].split(",")[1] == "20"  # all parked behind the head in rq.1
