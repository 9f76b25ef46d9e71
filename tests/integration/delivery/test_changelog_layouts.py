"""The group-state changelog shared by a topic's subscriptions
(docs/decisions/0014-no-topics-until-a-failure.md). An upgrade from the layout where each
subscription had one of its own (``setu.{project}.{subscription}.state``): a parked group
stays parked, a retrying group keeps its place, nothing is lost, reordered or delivered twice,
even when Redis forgot everything across the upgrade. A subscription deleted and made again
under its name does not inherit what the old one left there."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest
from confluent_kafka import OFFSET_BEGINNING, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from setu import names
from state.kafka_admin import changelog_config
from state.kafka_reader import KafkaReader
from state.shared_changelog import entries_in, split_key
from tests.integration.delivery.support import (
    Receiver,
    ThreadWorker,
    World,
    group_view,
    sub_path,
    wait_for,
)

pytestmark = pytest.mark.integration


def as_the_earlier_layout(world: World, topic: str, subscription: str, partitions: int) -> int:
    """Moves ``subscription``'s records out of its topic's changelog into one of its own, as an
    earlier version kept them, and leaves the topic's changelog empty; returns how many."""
    shared = names.groups_topic(world.project, topic)
    own = names.state_topic(world.project, subscription)
    reader = KafkaReader(world.bootstrap)
    try:
        tails = reader.tails(
            [TopicPartition(shared, p, OFFSET_BEGINNING) for p in range(partitions)]
        )
    finally:
        reader.close()
    admin = AdminClient({"bootstrap.servers": world.bootstrap})
    made = admin.create_topics([NewTopic(own, partitions, 1, config=changelog_config(1, 1 << 20))])
    made[own].result(15)
    producer = Producer({"bootstrap.servers": world.bootstrap, "acks": "all"})
    moved = 0
    for partition in range(partitions):
        for entry in entries_in(tails, shared, partition):
            split = split_key(entry.key)
            if split is None or split[0] != subscription:
                continue
            headers = [] if entry.epoch is None else [("setu-epoch", str(entry.epoch).encode())]
            producer.produce(own, entry.value, split[1], partition=partition, headers=headers)
            moved += 1
    assert producer.flush(15) == 0
    world.topics.remove([shared])
    world.topics.ensure_groups(world.store.get_topic(world.project, topic))
    return moved


def test_an_upgrade_from_changelogs_of_their_own_keeps_parked_and_retrying_groups(
    world: World, receiver: Receiver, start_worker: Callable[..., ThreadWorker], api: httpx.Client
) -> None:
    # Given a subscription delivered under the earlier layout: G parked behind its
    # dead-lettered head, R waiting in its retry tier for a retry 20 s away, H delivered
    world.topic("t", partitions=2)
    world.subscription(receiver.url, delays_ms=(20_000,))
    receiver.answer("G", 400)
    receiver.answer("R", 503)
    g = world.publish("t", "G", 3)
    r = world.publish("t", "R", 2)
    h = world.publish("t", "H", 2)
    worker = start_worker()
    wait_for("G parked", lambda: group_view(api, world, "G")["parked"] == 3, 60)
    wait_for("R retrying", lambda: group_view(api, world, "R")["state"] == "retrying", 60)
    wait_for("H delivered", lambda: receiver.delivered("H") == h, 60)
    worker.stop()
    # (its group state in a changelog of its own, the topic's changelog empty)
    assert as_the_earlier_layout(world, "t", "s", 2) > 0
    # And Redis forgot everything across the upgrade: only that changelog knows
    world.forget_redis()
    # And, while no worker runs, a later message of G and a new group
    late = world.publish("t", "G")
    sentinel = world.publish("t", "S")
    receiver.heal()

    # When a worker of this version takes the subscription over
    start_worker()

    # Then the new group is delivered, and G's later message waits behind its parked head
    wait_for("the new group", lambda: receiver.delivered("S") == sentinel, 60)
    wait_for("G's later message parked too", lambda: group_view(api, world, "G")["parked"] == 4)
    assert receiver.delivered("G") == []
    # And R is delivered from its tier, in order, its head on its second attempt
    wait_for("R delivered", lambda: receiver.delivered("R") == r, 60)
    assert [c.attempt for c in receiver.attempts(r[0])] == [1, 2]
    # And an operator's unsideline delivers G in order, its later message last
    answer = api.post(sub_path(world, "dlq/unsideline"), json={"group_ids": ["G"]})
    assert answer.json() == {"requeued": 4}
    wait_for("G delivered", lambda: receiver.delivered("G") == [*g, *late], 60)
    # And nothing was delivered twice
    assert receiver.delivered("H") == h
    assert receiver.delivered("S") == sentinel


def test_a_subscription_deleted_and_made_again_under_its_name_starts_with_no_parked_group(
    world: World, receiver: Receiver, start_worker: Callable[..., ThreadWorker], api: httpx.Client
) -> None:
    # Given a subscription with G parked behind its dead-lettered head, and a worker running
    world.topic("t", partitions=2)
    subscriptions = f"/v1/projects/{world.project}/subscriptions"
    made = {"name": "s", "topic": "t", "grouped": True, "endpoint": {"url": receiver.url}}
    assert api.post(subscriptions, json=made).status_code == 201
    receiver.answer("G", 400)
    g = world.publish("t", "G", 2)
    start_worker()
    wait_for("G parked", lambda: group_view(api, world, "G")["parked"] == 2, 60)
    # When it is deleted, and one of the same name is made on the same topic (reading the
    # topic from its beginning, as a new subscription does)
    assert api.delete(f"{subscriptions}/s").status_code == 204
    receiver.heal()
    assert api.post(subscriptions, json=made).status_code == 201
    later = world.publish("t", "G")
    # Then the new one knows nothing of the old one's parked group: G is delivered, in order
    wait_for("G delivered to the new one", lambda: receiver.delivered("G") == [*g, *later], 60)
