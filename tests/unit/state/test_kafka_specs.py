"""Which Kafka topics a Setu topic and a subscription own, and how they are configured."""

from __future__ import annotations

import pytest

from setu.limits import HEADER_ALLOWANCE_BYTES
from setu.model import Endpoint, RetryPolicy, Subscription, Topic
from state.kafka_admin import (
    owned_by_subscription,
    subscription_specs,
    topic_config,
    topic_specs,
)


def test_topic_owns_its_ingest_topic_main_log_and_group_changelog_with_its_partitions() -> None:
    specs = topic_specs(
        Topic("p", "orders", partitions=12), replication_factor=1, max_message_bytes=10
    )
    assert [(s.name, s.partitions) for s in specs] == [
        ("setu.p.orders.ingest", 12),
        ("setu.p.orders", 12),
        ("setu.p.orders.ingest.rejects", 12),
        ("setu.p.orders.groups", 12),
    ]
    # The subscriptions of the topic keep their group state in its changelog (decision 0014)
    assert specs[-1].config["cleanup.policy"] == "compact"


@pytest.mark.parametrize("tiers", [0, 1, 3, 9])
def test_subscription_owns_its_tiers_and_dlq_and_uses_its_topics_changelog(
    tiers: int,
) -> None:
    sub = Subscription("p", "s", "orders", Endpoint("https://h"), retry=RetryPolicy((5,) * tiers))
    specs = subscription_specs(sub, Topic("p", "orders", partitions=7), 1, 10)
    assert [s.name for s in specs] == [f"setu.p.s.rq.{n}" for n in range(1, tiers + 1)] + [
        "setu.p.s.dlq",
        "setu.p.orders.groups",
    ]
    assert {s.partitions for s in specs} == {7}


@pytest.mark.parametrize(("replicas", "min_isr"), [(1, "1"), (3, "2")])
def test_the_changelog_is_compacted_and_keeps_acknowledged_writes_on_two_replicas(
    replicas: int, min_isr: str
) -> None:
    sub = Subscription("p", "s", "orders", Endpoint("https://h"))
    config = subscription_specs(sub, Topic("p", "orders"), replicas, 10)[-1].config
    assert config["cleanup.policy"] == "compact"
    assert "retention.ms" not in config  # compaction alone decides what goes
    assert config["min.insync.replicas"] == min_isr


def test_deleting_a_subscription_covers_every_possible_tier_and_its_changelog() -> None:
    owned = owned_by_subscription("p", "s")
    assert owned[0] == "setu.p.s.rq.1"
    assert owned[-3:] == ["setu.p.s.rq.9", "setu.p.s.dlq", "setu.p.s.state"]


@pytest.mark.parametrize(("replicas", "min_isr"), [(1, "1"), (2, "1"), (3, "2"), (5, "2")])
def test_topic_config(replicas: int, min_isr: str) -> None:
    config = topic_config(
        retention_hours=2, replication_factor=replicas, max_message_bytes=2 * 1024 * 1024
    )
    assert config["retention.ms"] == str(2 * 3_600_000)
    assert config["min.insync.replicas"] == min_isr
    assert config["max.message.bytes"] == str(2 * 1024 * 1024 + HEADER_ALLOWANCE_BYTES)


@pytest.mark.parametrize(("hours", "retention_ms"), [(None, "-1"), (24 * 90, str(90 * 86_400_000))])
def test_dead_letters_keep_their_own_retention_and_tiers_keep_the_topics(
    hours: int | None, retention_ms: str
) -> None:
    # Given a topic that keeps messages 48 hours
    sub = Subscription("p", "s", "orders", Endpoint("https://h"), retry=RetryPolicy((5, 6)))
    topic = Topic("p", "orders", retention_hours=48)
    specs = {s.name: s.config for s in subscription_specs(sub, topic, 1, 10, hours)}
    # Then parked dead letters are not deleted with it: unless a dead-letter retention is
    # set, they stay for ever; the retry tiers follow the topic
    assert specs["setu.p.s.dlq"]["retention.ms"] == retention_ms
    assert specs["setu.p.s.rq.1"]["retention.ms"] == str(48 * 3_600_000)
