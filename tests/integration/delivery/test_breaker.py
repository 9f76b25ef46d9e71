"""The circuit breaker and auto-pause on the real broker and Redis (docs/policies.md §2, §3)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from cli.ports import any_free_port
from setu.model import SubscriptionState
from setu.policies import BreakerPolicy, DeadLetterWindow, Policies
from tests.integration.delivery.support import (
    Outage,
    Receiver,
    ThreadWorker,
    World,
    labels,
    scrape,
    three_workers,
    wait_for,
)

pytestmark = pytest.mark.integration

FAST = BreakerPolicy(failure_ratio=0.5, min_calls=4, window_s=10, open_s=1)


def status(api: httpx.Client, world: World) -> dict[str, Any]:
    answer = api.get(f"/v1/projects/{world.project}/subscriptions/s/status")
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


def test_an_outage_opens_the_breaker_spends_no_attempts_and_recovery_keeps_order(
    world: World,
    receiver: Receiver,
    start_worker: Callable[..., ThreadWorker],
    api: httpx.Client,
) -> None:
    # Given a subscription with a quick breaker and an endpoint that is down
    world.topic("t")
    world.subscription(
        receiver.url,
        delays_ms=(200, 200),
        policies=Policies(circuit_breaker=FAST, auto_pause_after_s=None),
    )
    groups = [f"g{i}" for i in range(6)]
    outage = Outage(receiver, groups)
    ids = {g: world.publish("t", g, 3) for g in groups}
    port = any_free_port()
    start_worker(delivery_metrics_port=port)
    # Then the breaker opens, and status says so with the endpoint's last answer
    wait_for(
        "the breaker open in status", lambda: status(api, world)["breaker"]["state"] != "closed"
    )
    seen = status(api, world)["breaker"]
    assert seen["last_error"] == "HTTP 503" and seen["since_ms"] > 0
    # And while the outage lasts (several half-open probes fail), every failed call made
    # after it opened is given back: the calls keep their attempt numbers
    given_back = ("setu_delivery_breaker_given_back_total", labels(world))
    wait_for("three failed probes", lambda: scrape(port).get(given_back, 0) >= 4 + 3)
    failed = [c for c in receiver.calls if c.status == 503]
    counted = len(failed) - int(scrape(port)[given_back])
    assert counted <= FAST.min_calls - 1, counted
    assert world.dlq_size() == 0
    # When the endpoint comes back, the next probe closes the breaker and every group is
    # delivered in order
    outage.end()
    wait_for(
        "every group in order",
        lambda: all(receiver.delivered(g) == published for g, published in ids.items()),
    )
    assert world.dlq_size() == 0
    # And no message spent more than the failures counted before the breaker opened
    assert all(c.attempt <= 2 for c in receiver.calls)
    wait_for(
        "the breaker closed in status", lambda: status(api, world)["breaker"]["state"] == "closed"
    )
    opened = ("setu_delivery_breaker_opened_total", labels(world))
    assert scrape(port)[opened] >= 1
    state = ("setu_delivery_breaker_state", labels(world, state="closed"))
    assert scrape(port)[state] == 1


def test_an_endpoint_broken_longer_than_auto_pause_after_s_pauses_the_subscription(
    world: World,
    receiver: Receiver,
    start_worker: Callable[..., ThreadWorker],
    api: httpx.Client,
) -> None:
    # Given an endpoint that stays down and a subscription that pauses after 1 s of outage
    world.topic("t")
    world.subscription(
        receiver.url,
        policies=Policies(
            circuit_breaker=BreakerPolicy(failure_ratio=0.5, min_calls=2, window_s=10, open_s=1),
            auto_pause_after_s=1,
        ),
    )
    Outage(receiver, ["g1", "g2", "g3"])
    for group in ("g1", "g2", "g3"):
        world.publish("t", group, 2)
    start_worker()
    # Then it is paused with the reason recorded, shown by the subscription and its status
    wait_for(
        "the policy pause",
        lambda: world.store.get_subscription(world.project, "s").state is SubscriptionState.PAUSED,
    )
    reason = world.store.get_subscription(world.project, "s").paused_reason
    assert reason is not None and reason.startswith("endpoint broken for ")
    assert "last error: HTTP 503" in reason
    assert status(api, world)["paused_reason"] == reason
    view = api.get(f"/v1/projects/{world.project}/subscriptions/s").json()
    assert (view["state"], view["paused_reason"]) == ("paused", reason)
    # When an operator resumes it, the reason is cleared
    resumed = api.post(f"/v1/projects/{world.project}/subscriptions/s/resume")
    assert resumed.json() == {"state": "running"}
    assert world.store.get_subscription(world.project, "s").paused_reason is None


def test_a_dead_letter_window_pauses_a_subscription_that_dead_letters_too_much(
    world: World,
    receiver: Receiver,
    start_worker: Callable[..., ThreadWorker],
) -> None:
    # Given an endpoint that refuses every message (400: dead-lettered at once) and a
    # window of "more than 2 of the last 4"
    world.topic("t")
    world.subscription(
        receiver.url,
        policies=Policies(dead_letter_window=DeadLetterWindow(size=4, threshold=2)),
    )
    groups = [f"g{i}" for i in range(5)]
    for group in groups:
        receiver.answer(group, 400)
        world.publish("t", group)
    start_worker()
    # Then the subscription pauses itself, saying why
    wait_for(
        "the policy pause",
        lambda: world.store.get_subscription(world.project, "s").state is SubscriptionState.PAUSED,
    )
    reason = world.store.get_subscription(world.project, "s").paused_reason
    # (checked each second: by then 3 to 5 of the messages may have been dead-lettered)
    assert reason is not None
    assert re.fullmatch(
        r"dead_letter_window: [345] of the last [345] messages dead-lettered \(more than 2 of 4\)",
        reason,
    ), reason


def test_a_policy_pause_reaches_every_worker_before_their_next_listing(
    world: World, receiver: Receiver, start_worker: Callable[..., ThreadWorker]
) -> None:
    # Given two workers that list subscriptions only every two minutes, sharing a
    # subscription whose endpoint refuses every message (dead-lettered at once) and which
    # pauses at "more than 2 of the last 4"
    world.topic("t", partitions=4)
    world.subscription(
        receiver.url,
        policies=Policies(dead_letter_window=DeadLetterWindow(size=4, threshold=2)),
    )
    for n in range(2):
        start_worker(worker_id=f"w{n}-{world.project}", subscription_refresh_ms=120_000)
    wait_for(
        "two workers sharing the partitions",
        lambda: sum(1 for r in world.worker_reports() if r["partitions"]) == 2,
    )
    groups = [f"g{i}" for i in range(8)]
    for group in groups:
        receiver.answer(group, 400)
        world.publish("t", group)
    # When a worker's policy check pauses it
    wait_for(
        "the policy pause",
        lambda: world.store.get_subscription(world.project, "s").state is SubscriptionState.PAUSED,
    )
    # Then both workers pause it within seconds, not at their next listing (the worker that
    # stored the pause told them all, as the API does)
    wait_for(
        "both workers paused",
        lambda: [r["paused"] for r in world.worker_reports()] == [True, True],
        timeout_s=30,
    )


def breakers(world: World) -> list[str]:
    """The breaker state each worker running ``s`` last reported."""
    return [r["breaker"]["state"] for r in world.worker_reports()]


def test_workers_share_an_open_breaker_and_one_started_in_the_outage_opens_at_once(
    world: World, receiver: Receiver, start_worker: Callable[..., ThreadWorker]
) -> None:
    # Given three workers of a subscription whose endpoint goes down
    world.topic("t", partitions=6)
    world.subscription(
        receiver.url,
        delays_ms=(200, 200),
        policies=Policies(circuit_breaker=FAST, auto_pause_after_s=None),
    )
    three_workers(world, start_worker)
    groups = [f"g{i}" for i in range(12)]
    outage = Outage(receiver, groups)
    ids = {g: world.publish("t", g, 2) for g in groups}
    # Then every worker's breaker opens, on its own calls or on another's word
    wait_for("three open breakers", lambda: breakers(world).count("closed") == 0)
    # And a worker started during the outage opens on their word (within a second)
    start_worker(worker_id=f"late-{world.project}")
    wait_for(
        "four open breakers",
        lambda: len(breakers(world)) == 4 and breakers(world).count("closed") == 0,
    )
    # When the endpoint is back, one probe closes a breaker and the others follow
    outage.end()
    wait_for(
        "every group in order",
        lambda: all(receiver.delivered(g) == published for g, published in ids.items()),
        timeout_s=60,
    )
    wait_for("every breaker closed", lambda: set(breakers(world)) == {"closed"})
    assert world.dlq_size(partitions=6) == 0
