"""Kafka topics of topics and subscriptions, on the real broker."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource

from setu.errors import Conflict, DependencyUnavailable
from setu.model import Endpoint, RetryPolicy, Subscription, Topic
from state import kafka_admin
from state.kafka_admin import KafkaTopics

pytestmark = pytest.mark.integration


@pytest.fixture
def admin(kafka_bootstrap: str) -> KafkaTopics:
    return KafkaTopics(kafka_bootstrap, max_message_bytes=1024 * 1024, timeout_s=10)


@pytest.fixture
def topic(admin: KafkaTopics) -> Iterator[Topic]:
    topic = Topic(f"p{uuid.uuid4().hex[:10]}", "orders", partitions=3, retention_hours=2)
    yield topic
    admin.delete_topic(topic)


def config_of(bootstrap: str, kafka_topic: str) -> dict[str, str]:
    client = AdminClient({"bootstrap.servers": bootstrap})
    resource = ConfigResource(ConfigResource.Type.TOPIC, kafka_topic)
    entries = client.describe_configs([resource])[resource].result(timeout=10)
    return {name: entry.value for name, entry in entries.items()}


def test_topic_gets_ingest_and_main_with_its_partitions_and_retention(
    admin: KafkaTopics, topic: Topic, kafka_bootstrap: str
) -> None:
    admin.ensure_topic(topic)
    for name in (f"setu.{topic.project}.orders.ingest", f"setu.{topic.project}.orders"):
        assert admin.partition_count(name) == 3
        config = config_of(kafka_bootstrap, name)
        assert config["retention.ms"] == str(2 * 3_600_000)
        assert int(config["max.message.bytes"]) > 1024 * 1024


def test_ensuring_twice_is_fine_and_another_partition_count_conflicts(
    admin: KafkaTopics, topic: Topic
) -> None:
    admin.ensure_topic(topic)
    admin.ensure_topic(topic)
    with pytest.raises(Conflict, match="3 partitions"):
        admin.ensure_topic(Topic(topic.project, topic.name, partitions=4))


def test_topic_delete_is_idempotent(admin: KafkaTopics, topic: Topic) -> None:
    admin.ensure_topic(topic)
    admin.delete_topic(topic)
    admin.delete_topic(topic)
    assert admin.partition_count(f"setu.{topic.project}.orders") is None


def test_subscription_gets_tiers_and_dlq_and_delete_removes_them_with_its_group(
    admin: KafkaTopics, topic: Topic, kafka_bootstrap: str
) -> None:
    p = topic.project
    sub = Subscription(p, "s", "orders", Endpoint("https://h"), retry=RetryPolicy((1, 2)))
    admin.ensure_topic(topic)
    admin.ensure_subscription(sub, topic)
    owned = [f"setu.{p}.s.rq.1", f"setu.{p}.s.rq.2", f"setu.{p}.s.dlq"]
    assert [admin.partition_count(name) for name in owned] == [3, 3, 3]
    assert admin.partition_count(f"setu.{p}.s.rq.3") is None
    # Given the subscription's consumer group has committed offsets
    consumer = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": f"setu.sub.{p}.s"})
    consumer.assign([])
    consumer.commit(offsets=[TopicPartition(f"setu.{p}.orders", 0, 0)], asynchronous=False)
    consumer.close()
    # When the subscription's Kafka side is deleted (twice: it is idempotent)
    admin.delete_subscription(p, "s")
    admin.delete_subscription(p, "s")
    # Then its topics and its group are gone
    assert [admin.partition_count(name) for name in owned] == [None, None, None]
    groups = AdminClient({"bootstrap.servers": kafka_bootstrap}).list_consumer_groups().result()
    assert f"setu.sub.{p}.s" not in {g.group_id for g in groups.valid}


def test_more_tiers_are_added_to_an_existing_subscription(admin: KafkaTopics, topic: Topic) -> None:
    p = topic.project
    admin.ensure_topic(topic)
    admin.ensure_subscription(
        Subscription(p, "s", "orders", Endpoint("https://h"), retry=RetryPolicy((1,))), topic
    )
    admin.ensure_subscription(
        Subscription(p, "s", "orders", Endpoint("https://h"), retry=RetryPolicy((1, 2, 3))), topic
    )
    assert admin.partition_count(f"setu.{p}.s.rq.3") == 3
    admin.delete_subscription(p, "s")


def test_many_subscriptions_are_made_at_once_and_one_refusal_fails_only_its_own(
    admin: KafkaTopics, topic: Topic, kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a subscription whose topics exist, two whose topics were never made, and one
    # whose DLQ exists with another partition count
    p = topic.project
    admin.ensure_topic(topic)
    subs = [Subscription(p, f"s{i}", "orders", Endpoint("https://h")) for i in range(4)]
    admin.ensure_subscription(subs[0], topic)
    # (its own topics made once with 2 partitions, as for a topic of another shape)
    admin.ensure_subscription(subs[3], Topic(p, "other", partitions=2))
    admin.remove([f"setu.{p}.s3.rq.1", f"setu.{p}.s3.rq.2", f"setu.{p}.s3.rq.3"])
    removed: list[str] = []
    remove = admin._delete

    def recorded(names: list[str]) -> None:
        removed.extend(names)
        remove(names)

    monkeypatch.setattr(admin, "_delete", recorded)
    try:
        # When all four are ensured together
        outcomes = admin.ensure_subscriptions([(sub, topic) for sub in subs])
        # Then nothing the batch made is removed when it fails (others may use it already)
        assert removed == []
        # Then the three that can be are whole, with the topic's partitions
        assert [outcomes[(p, f"s{i}")] for i in range(3)] == [None, None, None]
        for i in range(3):
            owned = [f"setu.{p}.s{i}.{t}" for t in ("rq.1", "rq.2", "rq.3", "dlq")]
            assert [admin.partition_count(name) for name in owned] == [3] * 4
            dlq = config_of(kafka_bootstrap, f"setu.{p}.s{i}.dlq")
            assert dlq["retention.ms"] == "-1"  # dead letters kept for ever by default
        # And the fourth fails alone, naming the conflict
        assert isinstance(outcomes[(p, "s3")], Conflict)
        assert "2 partitions" in str(outcomes[(p, "s3")])
    finally:
        for sub in subs:
            admin.delete_subscription(p, sub.name)
        admin.remove([f"setu.{p}.other.groups"])


def test_subscriptions_whose_topics_exceed_one_request_are_made_in_several(
    admin: KafkaTopics,
    topic: Topic,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Given a broker that takes at most 7 partitions a request (Kafka's own limit is 10,000,
    # which 1,000 subscriptions' topics pass: 30,000 partitions)
    monkeypatch.setattr(kafka_admin, "MAX_PARTITIONS_PER_REQUEST", 7)
    p = topic.project
    admin.ensure_topic(topic)
    subs = [Subscription(p, f"s{i}", "orders", Endpoint("https://h")) for i in range(3)]
    try:
        # When three new subscriptions (15 topics of 3 partitions) are ensured together
        outcomes = admin.ensure_subscriptions([(sub, topic) for sub in subs])
        # Then each is whole, made in the batch without falling back to one at a time
        assert list(outcomes.values()) == [None, None, None]
        for i in range(3):
            owned = [f"setu.{p}.s{i}.{t}" for t in ("rq.1", "rq.2", "rq.3", "dlq")]
            assert [admin.partition_count(name) for name in owned] == [3] * 4
        # And their group state goes to the topic's changelog, made once for all three
        assert admin.partition_count(f"setu.{p}.orders.groups") == 3
        assert "one at a time" not in caplog.text
    finally:
        for sub in subs:
            admin.delete_subscription(p, sub.name)


def test_unreachable_kafka_is_503() -> None:
    admin = KafkaTopics("127.0.0.1:1", timeout_s=1)
    with pytest.raises(DependencyUnavailable):
        admin.ensure_topic(Topic("p", "t"))
    with pytest.raises(DependencyUnavailable):
        admin.broker_count(0.5)
