"""A new subscription from the user's side: its create is answered before its Kafka topics
exist (docs/delivery.md, "A new subscription"), and its first messages must still arrive, in
order and through retries, soon after it was made."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest

from setu import names
from tests.integration.delivery.support import Receiver, ThreadWorker, World, wait_for

pytestmark = pytest.mark.integration


def test_a_subscription_whose_topics_were_never_made_is_delivered_through_its_retries(
    world: World, receiver: Receiver, start_worker: Callable[..., ThreadWorker]
) -> None:
    # Given a subscription whose create was answered but whose Kafka topics were never made
    # (the API stopped right after answering it)
    world.topic("t", partitions=2)
    world.subscription(receiver.url, delays_ms=(100, 200), make_topics=False)
    tiers = names.subscription_topics(world.project, "s", 2)
    assert [world.topics.partition_count(t) for t in tiers] == [None, None, None]
    # And an endpoint that fails g1's first call, so its head must go through a retry tier
    receiver.answer("g1", 503, 200)
    ids = world.publish("t", "g1", 3)
    healthy = world.publish("t", "h", 2)
    # When a worker runs it
    start_worker()
    # Then every message arrives in order, the head on its second attempt from the tier
    wait_for("both groups delivered", lambda: receiver.delivered("g1") == ids, 60)
    assert receiver.delivered("h") == healthy
    assert [c.attempt for c in receiver.attempts(ids[0])] == [1, 2]
    # And the worker made its tiers, DLQ and changelog with the topic's partitions
    made = [*tiers, names.state_topic(world.project, "s")]
    assert [world.topics.partition_count(t) for t in made] == [2, 2, 2, 2]


def test_a_subscription_made_through_the_api_delivers_before_the_workers_next_listing(
    world: World,
    receiver: Receiver,
    api: httpx.Client,
    start_worker: Callable[..., ThreadWorker],
) -> None:
    # Given a worker that lists subscriptions only every two minutes, and has listed once
    # (it delivers a subscription of another topic made before it started)
    world.topic("t", partitions=2)
    world.topic("other", partitions=1)
    world.subscription(receiver.url, name="early", topic="other")
    first = world.publish("other", "e", 1)
    start_worker(subscription_refresh_ms=120_000)
    wait_for("the worker's first listing", lambda: receiver.delivered("e") == first, 60)
    # When a subscription is made through the API and a message published
    made = api.post(
        f"/v1/projects/{world.project}/subscriptions",
        json={"name": "s", "topic": "t", "grouped": True, "endpoint": {"url": receiver.url}},
    )
    assert made.status_code == 201, made.text
    ids = world.publish("t", "g1", 2)
    # Then it arrives well before that listing: the API told the workers of the change
    wait_for("the new subscription's first messages", lambda: receiver.delivered("g1") == ids, 30)
    # And its Kafka topics exist with the topic's partitions
    topics = [
        *names.subscription_topics(world.project, "s", 3),
        names.state_topic(world.project, "s"),
    ]
    assert {t: world.topics.partition_count(t) for t in topics} == dict.fromkeys(topics, 2)
