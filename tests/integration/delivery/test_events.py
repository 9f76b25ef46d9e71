"""Operational events at a project's notification endpoint (docs/policies.md §4)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from standardwebhooks.webhooks import Webhook

from delivery import events
from setu.policies import BreakerPolicy, DeadLetterWindow, Policies
from tests.integration.delivery.support import (
    Outage,
    ProcessWorker,
    Receiver,
    ThreadWorker,
    World,
    wait_for,
)

pytestmark = pytest.mark.integration

SECRET = "whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM="


@pytest.fixture(autouse=True)
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    """Dead letters batched over half a second, failed events tried again after 200 ms."""
    monkeypatch.setattr(events, "DEAD_LETTER_BATCH_S", 0.5)
    monkeypatch.setattr(events, "FIRST_RETRY_MS", 200)


def notify(api: httpx.Client, world: World, receiver: Receiver, *kinds: str) -> None:
    url = receiver.url.replace("/hook", "/events")
    answer = api.put(
        f"/v1/projects/{world.project}/notifications",
        json={"url": url, "signing_secret": SECRET, "events": list(kinds)},
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["has_signing_secret"] is True and SECRET not in answer.text


def received(receiver: Receiver) -> list[dict[str, Any]]:
    """Events the endpoint answered 2xx, after checking each one's signature."""
    out = []
    for call in [c for c in receiver.calls if c.path == "/events" and c.status == 200]:
        Webhook(SECRET).verify(call.body, call.headers)
        event = json.loads(call.body)
        assert call.headers["webhook-id"] == event["id"]
        out.append(event)
    return out


def of_type(receiver: Receiver, kind: str) -> list[dict[str, Any]]:
    return [e for e in received(receiver) if e["type"] == kind]


def failed_event_calls(receiver: Receiver) -> list[str]:
    """The ids of the events whose call the endpoint failed, in call order."""
    calls = [c for c in receiver.calls if c.path == "/events" and c.status == 503]
    return [c.headers["webhook-id"] for c in calls]


def breaker_events_wanted(world: World, receiver: Receiver, api: httpx.Client) -> None:
    """A subscription of topic t whose breaker opens on 4 calls, and a project that wants its
    breaker events at the receiver's ``/events``."""
    world.topic("t")
    world.subscription(
        receiver.url,
        policies=Policies(
            circuit_breaker=BreakerPolicy(failure_ratio=0.5, min_calls=4, window_s=10, open_s=1),
            auto_pause_after_s=None,
        ),
    )
    notify(api, world, receiver, "endpoint.breaker_opened", "endpoint.breaker_closed")


class Down:
    """A project that wants breaker events at an endpoint that is down, and a subscription of
    topic t whose webhook is down for six groups of two messages: its breaker opens."""

    def __init__(self, world: World, receiver: Receiver, api: httpx.Client) -> None:
        breaker_events_wanted(world, receiver, api)
        self.receiver = receiver
        self.events_down = threading.Event()
        self.events_down.set()
        with receiver.lock:
            receiver.rules[""] = lambda: 503 if self.events_down.is_set() else 200
        self.groups = [f"g{i}" for i in range(6)]
        self.outage = Outage(receiver, self.groups)
        self.ids = {g: world.publish("t", g, 2) for g in self.groups}

    def recover(self) -> None:
        """The event endpoint and the webhook answer 200 from now on."""
        self.events_down.clear()
        self.outage.end()

    def arrived(self, opening: str, timeout_s: float) -> None:
        """Waits until the breaker's opening ``opening`` arrived and every message was
        delivered."""
        receiver = self.receiver
        wait_for(
            "the opening",
            lambda: opening in {e["id"] for e in of_type(receiver, "endpoint.breaker_opened")},
            timeout_s,
        )
        ids = self.ids
        wait_for("every group", lambda: all(receiver.delivered(g) == ids[g] for g in ids), 60)


def test_breaker_events_arrive_signed_and_a_failing_endpoint_gets_them_later(
    world: World,
    receiver: Receiver,
    start_worker: Callable[..., ThreadWorker],
    api: httpx.Client,
) -> None:
    # Given a project that wants breaker events at an endpoint failing its first two calls
    breaker_events_wanted(world, receiver, api)
    receiver.answer("", 503, 503, 200)  # events carry no group
    groups = [f"g{i}" for i in range(6)]
    outage = Outage(receiver, groups)
    ids = {g: world.publish("t", g, 2) for g in groups}
    start_worker()
    # Then the opening reaches the endpoint once it answers, signed, naming the subscription
    wait_for("breaker_opened", lambda: of_type(receiver, "endpoint.breaker_opened"), 30)
    [opened] = of_type(receiver, "endpoint.breaker_opened")[:1]
    assert (opened["project"], opened["subscription"]) == (world.project, "s")
    assert opened["data"]["state"] == "open" and opened["data"]["last_error"] == "HTTP 503"
    failed = [c for c in receiver.calls if c.path == "/events" and c.status == 503]
    assert len(failed) == 2 and failed[0].headers["webhook-id"] == opened["id"]
    # And when the endpoint recovers, the closing arrives, while messages flow again
    outage.end()
    wait_for("breaker_closed", lambda: of_type(receiver, "endpoint.breaker_closed"), 30)
    wait_for("every group", lambda: all(receiver.delivered(g) == ids[g] for g in groups), 30)


def test_an_event_not_yet_taken_outlives_redis_coming_back_empty(
    world: World,
    receiver: Receiver,
    start_worker: Callable[..., ThreadWorker],
    api: httpx.Client,
) -> None:
    # Given a project that wants breaker events at an endpoint that is down, and a breaker
    # that opened: its event failed a call and waits to be tried again
    down = Down(world, receiver, api)
    start_worker()
    wait_for("the opening's first call to fail", lambda: failed_event_calls(receiver), 30)
    opening = failed_event_calls(receiver)[0]
    # When Redis comes back empty, and then the event endpoint and the webhook recover
    world.forget_redis()
    down.recover()
    # Then the opening arrives all the same, under its id, and every message is delivered
    down.arrived(opening, 30)


def test_an_event_whose_worker_was_killed_outlives_redis_coming_back_empty(
    world: World,
    receiver: Receiver,
    start_process: Callable[..., ProcessWorker],
    start_worker: Callable[..., ThreadWorker],
    api: httpx.Client,
) -> None:
    # Given a breaker that opened in a worker process whose notifier failed the opening's
    # first call (the event endpoint is down)
    down = Down(world, receiver, api)
    process = start_process()
    wait_for("the opening's first call to fail", lambda: failed_event_calls(receiver), 60)
    opening = failed_event_calls(receiver)[0]
    # When that worker is killed, Redis comes back empty, and everything recovers with
    # another worker
    process.kill()
    world.forget_redis()
    down.recover()
    start_worker()
    # Then the opening arrives all the same, under its id, and every message is delivered
    down.arrived(opening, 60)


def test_dead_letters_parked_groups_and_a_policy_pause_are_told(
    world: World,
    receiver: Receiver,
    start_worker: Callable[..., ThreadWorker],
    api: httpx.Client,
) -> None:
    # Given an endpoint refusing g1..g3 (400: dead-lettered at once), a window that pauses
    # after more than 2 of 4, and a project wanting every event but breaker ones
    world.topic("t")
    world.subscription(
        receiver.url,
        policies=Policies(dead_letter_window=DeadLetterWindow(size=4, threshold=2)),
    )
    notify(api, world, receiver, "message.dead_lettered", "group.parked", "subscription.paused")
    heads = {}
    for group in ("g1", "g2", "g3"):
        receiver.answer(group, 400)
        heads[group] = world.publish("t", group, 2)[0]
    start_worker()
    # Then each parked group is told, with its head and why
    wait_for("three groups parked", lambda: len(of_type(receiver, "group.parked")) == 3, 30)
    parked = {e["data"]["group_id"]: e["data"] for e in of_type(receiver, "group.parked")}
    assert {g: d["head_message_id"] for g, d in parked.items()} == heads
    assert all(d["reason"] == "status 400" for d in parked.values())
    # And the dead letters come batched: counts that add up to the three heads
    wait_for(
        "the dead letters",
        lambda: sum(e["data"]["count"] for e in of_type(receiver, "message.dead_lettered")) == 3,
        30,
    )
    sample = [
        m for e in of_type(receiver, "message.dead_lettered") for m in e["data"]["message_ids"]
    ]
    assert sorted(sample) == sorted(heads.values())
    # And the pause says why
    wait_for("the pause", lambda: of_type(receiver, "subscription.paused"), 30)
    [paused] = of_type(receiver, "subscription.paused")
    assert paused["data"]["reason"].startswith("dead_letter_window: 3 of the last 3")


def test_a_notification_endpoint_is_validated_and_shown_without_its_secret(
    world: World, api: httpx.Client
) -> None:
    path = f"/v1/projects/{world.project}/notifications"
    assert api.get(path).status_code == 404
    for bad in (
        {"url": "https://ops.example.com/e", "events": []},
        {"url": "https://ops.example.com/e", "events": ["group.parked", "group.parked"]},
        {"url": "https://ops.example.com/e", "events": ["message.delivered"]},
        {"url": "ftp://ops.example.com/e", "events": ["group.parked"]},
        {"url": "https://ops.example.com/e", "events": ["group.parked"], "signing_secret": "x"},
    ):
        assert api.put(path, json=bad).status_code == 400, bad
    assert api.get(path).status_code == 404  # nothing was stored
    body = {"url": "https://ops.example.com/e", "events": ["group.parked"]}
    assert api.put(path, json={**body, "signing_secret": SECRET}).status_code == 200
    # A PUT without the secret keeps it; null removes it
    kept = api.put(path, json={**body, "events": ["subscription.paused"]}).json()
    assert kept["has_signing_secret"] is True and kept["events"] == ["subscription.paused"]
    assert (
        api.put(path, json={**body, "signing_secret": None}).json()["has_signing_secret"] is False
    )
    assert api.delete(path).status_code == 204
    assert api.get(path).status_code == 404
