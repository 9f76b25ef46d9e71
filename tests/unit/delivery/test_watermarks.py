"""Reads of a subscription that was only just created (delivery/kafka_io.watermarks and
committed): its topics' partitions have no leader yet, a broker has not heard of them yet,
or its consumer group has no coordinator yet, for a moment; a status read in that moment
must wait for them, not answer 503."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from state.kafka_reader import committed, watermarks


class NewTopic:
    """A consumer's watermark read that fails with ``errors`` first, then answers."""

    def __init__(self, *errors: int) -> None:
        self.errors = list(errors)
        self.calls = 0
        self.refreshes = 0  # metadata asked for the topic

    def list_topics(self, topic: str, timeout: float) -> object:
        self.refreshes += 1
        return object()

    def get_watermark_offsets(
        self, tp: TopicPartition, timeout: float, cached: bool
    ) -> tuple[int, int]:
        self.calls += 1
        if self.errors:
            raise KafkaException(KafkaError(self.errors.pop(0)))
        return 3, 7


@pytest.mark.parametrize(
    "errors",
    [
        (KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE),
        (KafkaError._UNKNOWN_PARTITION, KafkaError.UNKNOWN_TOPIC_OR_PART),
    ],
)
def test_a_new_topic_is_read_once_its_partitions_are_known_and_led(errors: tuple[int, ...]) -> None:
    consumer = NewTopic(*errors)
    found = watermarks(
        consumer,  # type: ignore[arg-type]
        TopicPartition("t", 0),
        time.monotonic() + 5,
        wait_for_missing=True,
    )
    assert found == (3, 7) and consumer.calls == len(errors) + 1


def test_a_missing_topic_is_reported_at_once_when_it_may_not_exist() -> None:
    consumer = NewTopic(KafkaError._UNKNOWN_PARTITION, KafkaError._UNKNOWN_PARTITION)
    with pytest.raises(KafkaException):
        watermarks(
            consumer,  # type: ignore[arg-type]
            TopicPartition("t", 0),
            time.monotonic() + 5,
            wait_for_missing=False,
        )
    assert (consumer.calls, consumer.refreshes) == (2, 1)  # asked again once, after metadata


def test_a_topic_made_after_the_client_last_asked_for_metadata_is_read() -> None:
    # A consumer kept between reads does not know a changelog made since (state/kafka_reader.py)
    consumer = NewTopic(KafkaError._UNKNOWN_PARTITION)
    found = watermarks(
        consumer,  # type: ignore[arg-type]
        TopicPartition("t", 0),
        time.monotonic() + 5,
        wait_for_missing=False,
    )
    assert found == (3, 7) and (consumer.calls, consumer.refreshes) == (2, 1)


def test_a_partition_without_a_leader_past_the_deadline_is_an_error() -> None:
    consumer = NewTopic(*[KafkaError.NOT_LEADER_FOR_PARTITION] * 1000)
    with pytest.raises(KafkaException):
        watermarks(
            consumer,  # type: ignore[arg-type]
            TopicPartition("t", 0),
            time.monotonic() + 0.3,
            wait_for_missing=True,
        )
    assert 1 < consumer.calls < 20


class NewGroup:
    """A consumer whose committed-offsets read fails with ``errors`` first, then answers."""

    def __init__(self, *errors: int) -> None:
        self.errors = list(errors)

    def committed(self, partitions: list[TopicPartition], timeout: float) -> list[TopicPartition]:
        if self.errors:
            raise KafkaException(KafkaError(self.errors.pop(0)))
        return partitions


def test_a_new_group_is_read_once_its_coordinator_is_ready() -> None:
    consumer = NewGroup(KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_LOAD_IN_PROGRESS)
    asked = [TopicPartition("t", 0)]
    assert committed(consumer, asked, time.monotonic() + 5) == asked  # type: ignore[arg-type]


def test_a_committed_read_that_fails_otherwise_is_an_error_at_once() -> None:
    consumer = NewGroup(KafkaError.GROUP_AUTHORIZATION_FAILED)
    with pytest.raises(KafkaException):
        committed(consumer, [TopicPartition("t", 0)], time.monotonic() + 5)  # type: ignore[arg-type]
