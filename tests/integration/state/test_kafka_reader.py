"""Group-less reads on the real broker, through a reader that keeps its consumers between
reads (state/kafka_reader.py)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import OFFSET_BEGINNING, Producer, TopicPartition

from setu.names import state_topic
from state.kafka_admin import KafkaTopics
from state.kafka_reader import KafkaReader

pytestmark = pytest.mark.integration


@pytest.fixture
def topic(kafka_bootstrap: str) -> Iterator[str]:
    admin = KafkaTopics(kafka_bootstrap)
    name = f"reader-{uuid.uuid4().hex[:10]}"
    admin.ensure_changelog("reader", name, 2)  # a compacted topic of two partitions
    yield state_topic("reader", name)
    admin.remove([state_topic("reader", name)])


def produce(bootstrap: str, topic: str, partition: int, values: list[str]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    for value in values:
        producer.produce(topic, value.encode(), key=value.encode(), partition=partition)
    assert producer.flush(10) == 0


def test_reads_one_after_another_each_get_exactly_their_records(
    kafka_bootstrap: str, topic: str
) -> None:
    reader = KafkaReader(kafka_bootstrap)
    try:
        # Given five records in partition 0 and two in partition 1
        produce(kafka_bootstrap, topic, 0, [f"a{i}" for i in range(5)])
        produce(kafka_bootstrap, topic, 1, ["b0", "b1"])
        # When a changelog takeover reads partition 0 from the start, then from its end after
        # three more records arrived, with other reads of the same reader in between
        first = reader.tails([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        assert [
            m.value() for m in reader.tails([TopicPartition(topic, 1, 0)]).records[(topic, 1)]
        ] == [
            b"b0",
            b"b1",
        ]
        produce(kafka_bootstrap, topic, 0, ["a5", "a6", "a7"])
        second = reader.tails([TopicPartition(topic, 0, first.ends[(topic, 0)])])
        # Then each read has its records once, in order, and ends where the partition ended
        assert [m.value() for m in first.records[(topic, 0)]] == [
            f"a{i}".encode() for i in range(5)
        ]
        assert [m.offset() for m in second.records[(topic, 0)]] == [5, 6, 7]
        assert second.ends[(topic, 0)] == 8
        # And a paged read and an empty tail are right too
        records, position, end = reader.read(topic, 0, 2, 4)
        assert ([m.value() for m in records], position, end) == (
            [b"a2", b"a3", b"a4", b"a5"],
            6,
            False,
        )
        assert reader.tails([TopicPartition(topic, 1, 2)]).records[(topic, 1)] == []
        assert reader.first_offset(topic, 0) == 0
    finally:
        reader.close()


def test_a_topic_made_after_the_readers_consumers_were_kept_can_be_read_at_once(
    kafka_bootstrap: str, topic: str
) -> None:
    # Given a reader whose kept consumer read another topic before this one existed
    reader = KafkaReader(kafka_bootstrap)
    admin = KafkaTopics(kafka_bootstrap)
    name = f"late-{uuid.uuid4().hex[:10]}"
    try:
        produce(kafka_bootstrap, topic, 0, ["x"])
        assert len(reader.tails([TopicPartition(topic, 0, 0)]).records[(topic, 0)]) == 1
        # When a new changelog is made and read at once (a new subscription's takeover)
        admin.ensure_changelog("reader", name, 2)
        made = state_topic("reader", name)
        produce(kafka_bootstrap, made, 1, ["y"])
        tails = reader.tails([TopicPartition(made, 1, OFFSET_BEGINNING)])
        # Then its records are there
        assert [m.value() for m in tails.records[(made, 1)]] == [b"y"]
    finally:
        reader.close()
        admin.remove([state_topic("reader", name)])
