"""Shared readers (SETU_DELIVERY_READERS=shared, decision 0011), on the real broker and Redis:
several subscriptions of one topic read through one worker's readers, each in order, one's
trouble holding none of the others, and a subscription served before by a consumer of its own
carries on from where it was."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import httpx
import pytest

from tests.integration.delivery.support import (
    Receiver,
    ThreadWorker,
    World,
    parked,
    sub_path,
    wait_for,
)

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
    # call that outlived its timeout may come again, at either endpoint on a loaded machine:
    # the first of each counts)
    wait_for(
        "the stuck subscription caught up",
        lambda: set(receiver.delivered(path="/stuck")) == set(ids),
        180,
    )
    for group in groups:
        stuck = list(dict.fromkeys(receiver.delivered(group, path="/stuck")))
        assert stuck == list(dict.fromkeys(receiver.delivered(group, path="/fine")))


def test_a_subscription_moves_from_its_own_consumer_to_the_shared_readers(
    world: World, receiver: Receiver, start_worker: Callable[..., ThreadWorker]
) -> None:
    # Given a subscription served by a worker with a consumer per subscription, with a group
    # failing in the retry tiers (its third attempt 20 s after its second: still in the tiers
    # when the worker stops, however slow the machine)
    world.topic("t", partitions=2)
    world.subscription(receiver.url, delays_ms=(300, 20_000))
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


def test_a_rolling_upgrade_keeps_parked_groups_and_retries_and_delivers_each_message_once(
    world: World,
    receiver: Receiver,
    start_worker: Callable[..., ThreadWorker],
    api: httpx.Client,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Given a subscription served by a worker of the earlier layout (a consumer of its own),
    # with group p parked in the DLQ (its head rejected, two behind it), group f's head
    # waiting 20 s in the second retry tier (its third call will succeed), and a healthy h
    world.topic("t", partitions=2)
    world.subscription(receiver.url, delays_ms=(1_000, 20_000))
    receiver.answer("p", 400)
    receiver.answer("f", 503, 503, 200)
    first = {g: world.publish("t", g, 3) for g in ("p", "f", "h")}
    old = start_worker(delivery_readers="per-subscription")
    wait_for("h delivered", lambda: receiver.delivered("h") == first["h"], 60)
    wait_for("p parked", lambda: parked(api, world, "p", 3), 60)
    wait_for("f in its second tier", lambda: len(receiver.attempts(first["f"][0])) == 2, 60)
    # When a worker of the new layout starts beside it (a rolling upgrade), more is published,
    # and then the old worker stops
    new = start_worker(delivery_readers="shared", worker_id=f"new-{world.project}")
    later = {g: world.publish("t", g, 2) for g in ("p", "f", "h")}
    # (the new worker says it waits while the old one serves the subscription, no error)
    waiting = "waits for the earlier layout's workers to leave"
    wait_for("the new worker to wait", lambda: waiting in caplog.text, 60)
    old.stop()
    # Then the new worker carries on: h's later messages arrive, p stays parked with them
    wait_for("h's later messages", lambda: receiver.delivered("h") == first["h"] + later["h"], 90)
    wait_for("p still parked with its later messages", lambda: parked(api, world, "p", 5), 60)
    assert receiver.delivered("p") == []
    # And once the endpoint is fixed and an operator unsidelines p, every group arrives in
    # published order, each message once, f's head on its third attempt
    receiver.heal()
    answer = api.post(sub_path(world, "dlq/unsideline"), json={"group_ids": ["p"]})
    assert answer.status_code == 200
    for group in ("p", "f", "h"):
        wait_for(
            f"{group} delivered in order",
            lambda g=group: receiver.delivered(g) == first[g] + later[g],
            120,
        )
    wait_for("p healthy", lambda: api.get(sub_path(world, "groups/p")).json()["state"] == "healthy")
    assert [c.attempt for c in receiver.attempts(first["f"][0])] == [1, 2, 3]
    new.stop()
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR and r.name != "rdkafka"]
    assert errors == []
