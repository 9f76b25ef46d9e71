"""Group-less reads on the real broker, through a reader that keeps its consumers between
reads (state/kafka_reader.py)."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from setu.model import Topic
from setu.names import groups_topic
from state import kafka_reader
from state.kafka_admin import KafkaTopics
from state.kafka_reader import KafkaReader, Tails, all_watermarks, watermarks

pytestmark = pytest.mark.integration


@pytest.fixture
def topic(kafka_bootstrap: str) -> Iterator[str]:
    admin = KafkaTopics(kafka_bootstrap)
    name = f"reader-{uuid.uuid4().hex[:10]}"
    admin.ensure_groups(Topic("reader", name, partitions=2))  # a compacted topic of two partitions
    yield groups_topic("reader", name)
    admin.remove([groups_topic("reader", name)])


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
        admin.ensure_groups(Topic("reader", name, partitions=2))
        made = groups_topic("reader", name)
        produce(kafka_bootstrap, made, 1, ["y"])
        tails = reader.tails([TopicPartition(made, 1, OFFSET_BEGINNING)])
        # Then its records are there
        assert [m.value() for m in tails.records[(made, 1)]] == [b"y"]
    finally:
        reader.close()
        admin.remove([groups_topic("reader", name)])


def values(tails: Tails, key: tuple[str, int]) -> list[bytes | None]:
    return [m.value() for m in tails.records[key]]


async def test_many_callers_at_once_get_exactly_their_own_tails_in_one_read(
    kafka_bootstrap: str, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given two changelogs with records (a worker taking over many subscriptions at once)
    admin = KafkaTopics(kafka_bootstrap)
    name = f"other-{uuid.uuid4().hex[:10]}"
    admin.ensure_groups(Topic("reader", name, partitions=2))
    other = groups_topic("reader", name)
    reader = KafkaReader(kafka_bootstrap)
    reads: list[int] = []
    tails = reader.tails

    def counted(starts: list[TopicPartition], timeout_s: float = 60.0) -> Tails:
        reads.append(len(starts))
        return tails(starts, timeout_s)

    monkeypatch.setattr(reader, "tails", counted)
    try:
        produce(kafka_bootstrap, topic, 0, ["a0", "a1", "a2"])
        produce(kafka_bootstrap, other, 1, ["b0", "b1"])
        asks = {
            "a-all": [TopicPartition(topic, 0, OFFSET_BEGINNING)],
            "a-empty": [TopicPartition(topic, 1, OFFSET_BEGINNING)],
            "b-both": [TopicPartition(other, 0, 0), TopicPartition(other, 1, 1)],
            "gone": [TopicPartition(f"setu.reader.gone-{uuid.uuid4().hex[:8]}.state", 0, 0)],
        }
        # When each asks at the same moment, one of them for a topic that does not exist
        found = dict(
            zip(
                asks,
                await asyncio.gather(
                    *(reader.tails_together(starts) for starts in asks.values()),
                    return_exceptions=True,
                ),
                strict=True,
            )
        )
        # Then each gets its own partitions' records from its start, and their ends
        a_all, a_empty, b_both = found["a-all"], found["a-empty"], found["b-both"]
        assert isinstance(a_all, Tails) and isinstance(a_empty, Tails)
        assert isinstance(b_both, Tails)
        assert values(a_all, (topic, 0)) == [b"a0", b"a1", b"a2"]
        assert set(a_all.records) == {(topic, 0)} and a_all.ends == {(topic, 0): 3}
        assert values(a_empty, (topic, 1)) == [] and a_empty.ends == {(topic, 1): 0}
        assert values(b_both, (other, 1)) == [b"b1"] and values(b_both, (other, 0)) == []
        assert b_both.ends == {(other, 0): 0, (other, 1): 2}
        # And only the caller of the missing topic fails
        assert isinstance(found["gone"], KafkaException)
        # And the four were read together first (then each alone, as one failed)
        assert reads[0] == 5
        # When the same partition is asked from two starts at once
        low, high = await asyncio.gather(
            reader.tails_together([TopicPartition(topic, 0, 0)]),
            reader.tails_together([TopicPartition(topic, 0, 2)]),
        )
        # Then each read starts where it asked
        assert values(low, (topic, 0)) == [b"a0", b"a1", b"a2"]
        assert values(high, (topic, 0)) == [b"a2"]
    finally:
        reader.close()
        admin.remove([other])


def test_watermarks_of_many_partitions_at_once_are_those_asked_one_by_one(
    kafka_bootstrap: str, topic: str
) -> None:
    # Given a partition with records, one without, and one the client never heard of
    produce(kafka_bootstrap, topic, 0, ["a0", "a1"])
    consumer = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": "reader-marks"})
    try:
        deadline = time.monotonic() + 10
        parts = [TopicPartition(topic, 0), TopicPartition(topic, 1)]
        # When their watermarks are asked all at once
        marks = all_watermarks(consumer, parts, deadline)
        # Then they are what a read of each alone says
        assert marks == {
            (tp.topic, tp.partition): watermarks(consumer, tp, deadline, wait_for_missing=False)
            for tp in parts
        }
        assert marks[(topic, 0)] == (0, 2)
        # And a partition that does not exist fails the ask, as alone
        gone = TopicPartition(f"gone-{uuid.uuid4().hex}", 0)
        with pytest.raises(KafkaException):
            all_watermarks(consumer, [*parts, gone], deadline)
    finally:
        consumer.close()


def test_which_topics_exist_is_asked_in_one_go(kafka_bootstrap: str, topic: str) -> None:
    # Given a reader and a changelog of two partitions
    reader = KafkaReader(kafka_bootstrap)
    try:
        gone = f"setu.reader.gone-{uuid.uuid4().hex[:8]}.rq.4"
        # When a runner asks which of its possible tiers exist, one of them never made
        found = reader.existing([topic, gone, topic])
        # Then only the one made is named, and an empty ask asks nothing
        assert found == {topic}
        assert reader.existing([]) == set()
    finally:
        reader.close()


def test_runners_starting_at_once_all_learn_which_topics_exist(
    kafka_bootstrap: str, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a worker's new reader, and its runners all starting at once (each asks which of
    # its dropped tiers exist, in a thread: two runners of 100 failed with "Handle is
    # terminating" when each made the reader's admin client and one was dropped in use), on
    # a machine where making a client takes a while (a loaded one: 50 ms here)
    def slow_admin(config: dict[str, Any], **kwargs: Any) -> AdminClient:
        time.sleep(0.05)
        return AdminClient(config, **kwargs)

    monkeypatch.setattr(kafka_reader, "AdminClient", slow_admin)
    for _ in range(3):
        reader = KafkaReader(kafka_bootstrap)
        together = threading.Barrier(16)

        def ask(reader: KafkaReader = reader, together: threading.Barrier = together) -> set[str]:
            together.wait()
            return reader.existing([topic])

        try:
            # When sixteen ask together
            with ThreadPoolExecutor(16) as threads:
                asks = [threads.submit(ask) for _ in range(16)]
                # Then every one of them is answered
                assert [a.result(timeout=30) for a in asks] == [{topic}] * 16
        finally:
            reader.close()


def test_scattered_offsets_are_read_in_one_pass_with_jumps(
    kafka_bootstrap: str, topic: str
) -> None:
    # Given 3,000 records in partition 0 (held scheduled messages are such offsets)
    produce(kafka_bootstrap, topic, 0, [f"r{i}" for i in range(3_000)])
    reader = KafkaReader(kafka_bootstrap)
    try:
        # When some offsets close together and some far apart are asked, with one past the end
        wanted = [5, 6, 7, 900, 2_999, 1_200, 3_500]
        found = reader.read_offsets(topic, 0, wanted, gap=100)
        # Then each is the record at its offset, and the one past the end is left out
        assert {o: m.value() for o, m in found.items()} == {
            o: f"r{o}".encode() for o in wanted if o < 3_000
        }
        # And with the default gap (read through) the same
        assert set(reader.read_offsets(topic, 0, wanted)) == set(found)
    finally:
        reader.close()
