"""Shared readers (SETU_DELIVERY_READERS=shared, decision 0011), on the real broker and Redis:
several subscriptions of one topic read through one worker's readers, each in order, one's
trouble holding none of the others, and a subscription served before by a consumer of its own
carries on from where it was."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from tests.integration.delivery.support import Receiver, ThreadWorker, World, wait_for

pytestmark = pytest.mark.integration

SHARED = {"delivery_readers": "shared"}


def test_every_subscription_of_a_topic_gets_every_group_in_order(
    world: World, receiver: Receiver, start_worker: Callable[..., ThreadWorker]
) -> None:
    # Given one topic with three grouped subscriptions, each to its own path
    world.topic("t", partitions=3)
    names = ("a", "b", "c")
    for name in names:
        world.subscription(receiver.url.replace("/hook", f"/{name}"), name=name)
    ids = {g: world.publish("t", g, 4) for g in ("g1", "g2", "g3", "g4")}
    # When one worker with shared readers runs
    start_worker(**SHARED)
    # Then each subscription's endpoint got every group, in published order, once
    for name in names:
        for group, published in ids.items():
            wait_for(
                f"{name} got {group} in order",
                lambda n=name, g=group, p=published: receiver.delivered(g, path=f"/{n}") == p,
                60,
            )
    # And messages published while it runs reach them too
    more = world.publish("t", "g1", 3)
    for name in names:
        wait_for(
            f"{name} got the later messages",
            lambda n=name: receiver.delivered("g1", path=f"/{n}") == ids["g1"] + more,
            60,
        )


def test_a_subscription_whose_endpoint_hangs_holds_none_of_the_others(
    world: World, receiver: Receiver, start_worker: Callable[..., ThreadWorker]
) -> None:
    # Given two subscriptions of one topic, the first one's endpoint not answering at all
    world.topic("t", partitions=2)
    hung = threading.Event()
    receiver.hang_path("/stuck", hung)
    world.subscription(receiver.url.replace("/hook", "/stuck"), name="stuck", timeout_ms=60_000)
    world.subscription(receiver.url.replace("/hook", "/fine"), name="fine")
    start_worker(**SHARED)
    groups = [f"g{n}" for n in range(30)]
    try:
        # When more messages are published than the stuck one may hold (2,048)
        ids = [m for group in groups for m in world.publish("t", group, 100)]
        # Then the healthy subscription delivers every one of them while the other is stuck
        wait_for(
            "the healthy subscription delivered everything",
            lambda: set(receiver.delivered(path="/fine")) == set(ids),
            120,
        )
        assert receiver.delivered(path="/stuck") == []
    finally:
        hung.set()
    # And once the stuck endpoint answers, it gets everything too, each group in order (a
    # call that outlived its timeout while it hung may come again: the first of each counts)
    wait_for(
        "the stuck subscription caught up",
        lambda: set(receiver.delivered(path="/stuck")) == set(ids),
        180,
    )
    for group in groups:
        stuck = list(dict.fromkeys(receiver.delivered(group, path="/stuck")))
        assert stuck == receiver.delivered(group, path="/fine")


def test_a_subscription_moves_from_its_own_consumer_to_the_shared_readers(
    world: World, receiver: Receiver, start_worker: Callable[..., ThreadWorker]
) -> None:
    # Given a subscription served by a worker with a consumer per subscription, with a group
    # failing in the retry tiers
    world.topic("t", partitions=2)
    world.subscription(receiver.url, delays_ms=(300, 600))
    receiver.answer("f", 503, 503, 503, 503, 503, 503)
    first = {g: world.publish("t", g, 3) for g in ("f", "h")}
    old = start_worker(delivery_readers="per-subscription")
    wait_for("the healthy group delivered", lambda: receiver.delivered("h") == first["h"], 60)
    wait_for("the failing group tried", lambda: len(receiver.attempts(first["f"][0])) >= 2, 60)
    # When that worker stops and one with shared readers takes over, while more is published
    old.stop()
    later = {g: world.publish("t", g, 3) for g in ("f", "h")}
    receiver.heal()
    start_worker(**SHARED)
    # Then everything is delivered once, in order per group
    for group in ("f", "h"):
        wait_for(
            f"{group} delivered in order",
            lambda g=group: receiver.delivered(g) == first[g] + later[g],
            120,
        )
    assert len(receiver.delivered("h")) == len(set(receiver.delivered("h"))) == 6
