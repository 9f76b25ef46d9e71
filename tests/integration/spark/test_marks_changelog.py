"""Producer marks reach Redis from the changelog the ingest query writes, and come back when
Redis forgets them (spark/marks_changelog.py), against the real broker and Redis."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import suppress

import pytest
import redis
from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from setu.names import ingest_topic
from spark.marks import MarkPublisher
from spark.marks_changelog import MarksFollower, parse_entry
from spark.stream import MARKS_TOPIC
from state import keys
from state.producer_marks import ProducerMarks
from tests.integration.spark.support import wait_for


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis[bytes]]:
    c: redis.Redis[bytes] = redis.Redis.from_url(redis_url)
    yield c
    c.set(keys.producer_marks_loaded(), "1")
    c.close()


@pytest.fixture
def changelog(kafka_bootstrap: str) -> Iterator[Producer]:
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    new = NewTopic(MARKS_TOPIC, 1, 1, config={"cleanup.policy": "compact"})
    for future in admin.create_topics([new]).values():
        with suppress(KafkaException):  # made by another test before
            future.result(timeout=30)
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    yield producer
    producer.flush(10)


def write(changelog: Producer, topic: str, partition: int, producer: str, mark: str) -> None:
    changelog.produce(MARKS_TOPIC, key=f"{topic}/{partition}/{producer}", value=mark)
    assert changelog.flush(10) == 0


def follower(kafka_bootstrap: str, client: redis.Redis[bytes]) -> MarksFollower:
    return MarksFollower(kafka_bootstrap, MarkPublisher(client)).start()


def test_a_changelog_entry_names_topic_partition_and_a_producer_that_may_hold_slashes() -> None:
    assert parse_entry(b"setu.p.t.ingest/3/a/b", b"7:42") == (("setu.p.t.ingest", "a/b"), (7, 42))
    assert parse_entry(b"nonsense", b"7:42") is None
    assert parse_entry(b"setu.p.t.ingest/3/a", b"x") is None


def test_each_producer_gets_its_highest_mark_over_its_partitions(
    kafka_bootstrap: str, client: redis.Redis[bytes], changelog: Producer
) -> None:
    project = f"mk-{uuid.uuid4().hex[:8]}"
    topic = ingest_topic(project, "t")
    marks = ProducerMarks(client)
    running = follower(kafka_bootstrap, client)
    try:
        write(changelog, topic, 0, "p", "5:10")
        write(changelog, topic, 1, "p", "5:7")
        write(changelog, topic, 2, "q", "5:1")
        wait_for("q's mark", lambda: marks.mark(project, "t", "q") == (5, 1))
        assert marks.mark(project, "t", "p") == (5, 10)
        # A lower mark read later (another partition, or a replay) never lowers it
        write(changelog, topic, 1, "p", "5:9")
        write(changelog, topic, 2, "q", "5:2")
        wait_for("q's new mark", lambda: marks.mark(project, "t", "q") == (5, 2))
        assert marks.mark(project, "t", "p") == (5, 10)
    finally:
        running.stop()


def test_marks_redis_forgot_are_published_again_and_the_marker_set(
    kafka_bootstrap: str, client: redis.Redis[bytes], changelog: Producer
) -> None:
    project = f"mk-{uuid.uuid4().hex[:8]}"
    topic = ingest_topic(project, "t")
    marks = ProducerMarks(client)
    running = follower(kafka_bootstrap, client)
    try:
        write(changelog, topic, 0, "p", "5:10")
        wait_for("p's mark", lambda: marks.mark(project, "t", "p") == (5, 10))
        # When Redis comes back empty
        client.delete(keys.producer_marks(project, "t"), keys.producer_marks_loaded())
        # Then every mark is there again, and Redis says it holds them all
        wait_for("the marker", marks.all_loaded)
        assert marks.mark(project, "t", "p") == (5, 10)
    finally:
        running.stop()


def test_a_follower_started_later_publishes_what_was_written_before_it(
    kafka_bootstrap: str, client: redis.Redis[bytes], changelog: Producer
) -> None:
    # Given marks written while no follower ran (one stopped before publishing them), with
    # Redis claiming to hold every mark
    project = f"mk-{uuid.uuid4().hex[:8]}"
    topic = ingest_topic(project, "t")
    marks = ProducerMarks(client)
    client.set(keys.producer_marks_loaded(), "1")
    write(changelog, topic, 0, "p", "5:3")
    # When a follower starts
    running = follower(kafka_bootstrap, client)
    try:
        # Then it publishes them all the same
        assert running.caught_up(60)
        assert marks.mark(project, "t", "p") == (5, 3)
    finally:
        running.stop()
