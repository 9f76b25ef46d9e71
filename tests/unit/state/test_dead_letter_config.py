"""A subscription's DLQ takes the dead-letter retention when its topics are ensured
(state/kafka_admin.py), and a DLQ another process made a moment ago, which the broker does
not serve yet, does not fail the subscription (seen with a hundred made at once)."""

from __future__ import annotations

import concurrent.futures
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from setu.errors import InvalidInput
from setu.model import Endpoint, Subscription, Topic
from state.kafka_admin import KafkaTopics

TOPIC = Topic("p", "t", partitions=2)
SUB = Subscription("p", "s", "t", Endpoint("https://example.com/hook"))


def done(result: Any = None, error: int | None = None) -> concurrent.futures.Future[Any]:
    future: concurrent.futures.Future[Any] = concurrent.futures.Future()
    if error is None:
        future.set_result(result)
    else:
        future.set_exception(KafkaException(KafkaError(error)))
    return future


class Described:
    def __init__(self, partitions: int) -> None:
        self.partitions = [type("P", (), {"leader": object()})() for _ in range(partitions)]


class Broker:
    """An admin client whose topics all exist, and whose config changes answer ``error``."""

    def __init__(self, error: int | None) -> None:
        self.error = error
        self.configured: list[str] = []

    def describe_topics(self, topics: Any, request_timeout: float) -> dict[str, Any]:
        return {name: done(Described(2)) for name in topics.topic_names}

    def incremental_alter_configs(self, resources: list[Any]) -> dict[Any, Any]:
        self.configured += [r.name for r in resources]
        return {r: done(error=self.error) for r in resources}


def topics_on(broker: Broker) -> KafkaTopics:
    topics = KafkaTopics("127.0.0.1:1", timeout_s=1)
    topics._admin = broker  # type: ignore[assignment]
    return topics


@pytest.mark.parametrize("error", [None, KafkaError.UNKNOWN_TOPIC_OR_PART])
def test_a_dlq_is_configured_or_left_as_made_when_not_served_yet(error: int | None) -> None:
    broker = Broker(error)
    topics = topics_on(broker)
    assert topics.ensure_subscriptions([(SUB, TOPIC)]) == {("p", "s"): None}
    assert topics.ensure_subscription(SUB, TOPIC) == []
    assert broker.configured == ["setu.p.s.dlq", "setu.p.s.dlq"]


def test_a_dlq_whose_config_is_refused_fails_its_subscription() -> None:
    topics = topics_on(Broker(KafkaError.INVALID_CONFIG))
    outcome = topics.ensure_subscriptions([(SUB, TOPIC)])[("p", "s")]
    assert isinstance(outcome, InvalidInput)
    with pytest.raises(InvalidInput):
        topics.ensure_subscription(SUB, TOPIC)
