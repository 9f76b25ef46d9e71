"""A new subscription from the user's side: its create is answered before its Kafka topics
exist (docs/delivery.md, "A new subscription"), and its first messages must still arrive, in
order and through retries, soon after it was made."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import httpx
import pytest

from setu import names
from setu.model import RetryPolicy
from tests.integration.delivery.support import Receiver, ThreadWorker, World, sub_path, wait_for

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
    # And the worker made its tiers and DLQ with the topic's partitions; its group state is
    # in its topic's changelog, made with the topic
    made = [*tiers, names.groups_topic(world.project, "t")]
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
    # And it added no Kafka topic: its group state is in its topic's changelog, and its
    # endpoint never failed, so it has no retry tier or DLQ (decision 0014)
    assert world.topics.partition_count(names.state_topic(world.project, "s")) is None
    tiers = names.subscription_topics(world.project, "s", 3)
    assert [world.topics.partition_count(t) for t in tiers] == [None] * 4


def test_a_subscription_that_never_failed_costs_one_topic_and_its_first_failure_makes_its_tiers(
    world: World,
    receiver: Receiver,
    api: httpx.Client,
    start_worker: Callable[..., ThreadWorker],
) -> None:
    # Given a subscription whose endpoint answered every call so far
    world.topic("t", partitions=2)
    world.subscription(receiver.url, delays_ms=(100, 200))
    start_worker()
    healthy = world.publish("t", "h", 3)
    wait_for("the first messages", lambda: receiver.delivered("h") == healthy, 60)
    # Then it has no Kafka topic of its own: no retry tier, DLQ or changelog (decision 0014)
    tiers = names.subscription_topics(world.project, "s", 2)
    own = [*tiers, names.state_topic(world.project, "s")]
    assert [world.topics.partition_count(t) for t in own] == [None] * 4
    # And its status, groups and dead letters answer as for an empty one
    status = api.get(sub_path(world, "status"))
    assert status.status_code == 200, status.text
    assert (status.json()["retry_backlog"], status.json()["dead_lettered"]) == (0, 0)
    wait_for("the lag down to 0", lambda: api.get(sub_path(world, "status")).json()["lag"] == 0)
    letters = api.get(sub_path(world, "dlq/messages"))
    assert (letters.status_code, letters.json()["messages"]) == (200, [])
    group = api.get(sub_path(world, "groups/h"))
    assert (group.status_code, group.json()["state"]) == (200, "healthy"), group.text
    # When its endpoint fails a group's head once
    receiver.answer("g1", 503, 200)
    ids = world.publish("t", "g1", 3)
    # Then the head is retried from a tier made for it, and its group arrives in order
    wait_for("the failed group", lambda: receiver.delivered("g1") == ids, 60)
    assert [c.attempt for c in receiver.attempts(ids[0])] == [1, 2]
    assert [world.topics.partition_count(t) for t in tiers] == [2, 2, 2]


def test_a_worker_that_took_over_before_the_tiers_were_made_delivers_what_waits_there(
    world: World, receiver: Receiver, start_worker: Callable[..., ThreadWorker]
) -> None:
    # Given two workers serving a one-partition subscription that never failed: the first
    # owns the partition, the second runs the subscription with nothing assigned
    world.topic("t", partitions=1)
    world.subscription(receiver.url, delays_ms=(3_000, 3_000))
    first = start_worker(worker_id=f"w1-{world.project}")
    early = world.publish("t", "e", 1)
    wait_for("the first worker delivering", lambda: receiver.delivered("e") == early, 60)
    start_worker(worker_id=f"w2-{world.project}")
    wait_for("both workers running it", lambda: len(world.worker_reports()) == 2, 60)
    # When the endpoint fails a head, so the first worker makes the tiers and copies it to
    # rq.1 (with its group's later messages), and the first worker then stops
    receiver.answer("g1", 503, 503, 200)
    ids = world.publish("t", "g1", 3)
    wait_for("the head's first failure", lambda: len(receiver.attempts(ids[0])) == 1, 60)
    rq1 = names.retry_topic(world.project, "s", 1)
    wait_for("the head copied to rq.1", lambda: world.topics.partition_count(rq1) == 1, 30)
    first.stop()
    # Then the second worker, which saw no tiers when it started, delivers the group in order
    wait_for("the group from the tiers", lambda: receiver.delivered("g1") == ids, 90)
    assert [c.attempt for c in receiver.attempts(ids[0])] == [1, 2, 3]


def test_a_tier_added_to_a_running_subscription_is_made_at_its_first_copy_there(
    world: World, receiver: Receiver, start_worker: Callable[..., ThreadWorker]
) -> None:
    # Given a running subscription with one retry tier, which its endpoint's first failure
    # made (with its DLQ)
    world.topic("t", partitions=1)
    sub = world.subscription(receiver.url, delays_ms=(100,))
    start_worker()
    receiver.answer("g1", 503, 200)
    first = world.publish("t", "g1", 2)
    wait_for("g1 through rq.1", lambda: receiver.delivered("g1") == first, 60)
    # When it gains a second tier (and a new path, which tells the runner that has it)
    grown = dataclasses.replace(
        sub,
        retry=RetryPolicy(delays_ms=(100, 100)),
        endpoint=dataclasses.replace(sub.endpoint, url=f"{receiver.url}/grown"),
    )
    world.store.update_subscription(grown, sub.version)

    def runs_grown() -> bool:
        world.publish("t", "probe", 1)
        return bool(receiver.delivered("probe", path="/hook/grown"))

    wait_for("the runner of the grown subscription", runs_grown, 60)
    rq2 = names.retry_topic(world.project, "s", 2)
    assert world.topics.partition_count(rq2) is None
    # And a head fails twice
    receiver.answer("g2", 503, 503, 200)
    ids = world.publish("t", "g2", 2)
    # Then it is retried from rq.2, made for it, and its group arrives in order
    wait_for("g2 through rq.2", lambda: receiver.delivered("g2") == ids, 60)
    assert [c.attempt for c in receiver.attempts(ids[0])] == [1, 2, 3]
    assert world.topics.partition_count(rq2) == 1
