"""The shared ingest log (``SETU_INGEST_LOG=shared``, decision 0010): every topic's records in one
log, each naming its topic in a header, through the same query and operator as the topics' own
ingest topics, in real-time mode whatever the number of topics."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import NewTopic
from pyspark.sql import SparkSession

from setu import names
from setu.envelope import H_TOPIC, Envelope
from state import keys
from tests.integration.spark.support import IngestWorld, MainLog, run_ingest

pytestmark = [pytest.mark.integration, pytest.mark.spark]


@pytest.fixture
def shared(
    spark_session: SparkSession, kafka_bootstrap: str, redis_url: str, tmp_path: Path
) -> Iterator[IngestWorld]:
    """A project whose records go through a shared ingest log of 3 partitions."""
    w = IngestWorld(spark_session, kafka_bootstrap, redis_url, tmp_path, shared_partitions=3)
    yield w
    w.close()


def per_group(log: MainLog) -> dict[str, list[str]]:
    groups: dict[str, list[str]] = defaultdict(list)
    for _, _, envelope in log.records:
        groups[envelope.group_id or envelope.message_id].append(envelope.message_id)
    return groups


def test_topics_sharing_one_log_keep_each_groups_order_and_their_own_producers(
    shared: IngestWorld,
) -> None:
    # Given two topics of 2 and 4 partitions on a shared log of 3, and the same 4 producer ids
    # and 10 group ids writing both, interleaved, every 10th message retried at once
    shared.create_topic("a", partitions=2)
    shared.create_topic("b", partitions=4)
    expected: dict[str, dict[str, list[str]]] = {"a": defaultdict(list), "b": defaultdict(list)}
    for i in range(800):
        # Each producer writes both topics; its sequences in b run 1,000 above those in a
        topic, producer, group = "ab"[i % 2], f"p{(i // 2) % 4}", f"g{(i * 7) % 10}"
        seq = i // 8 + (1000 if topic == "b" else 0)
        shared.send(topic, f"{topic}{i}", group, producer, seq)
        expected[topic][group].append(f"{topic}{i}")
        if i % 10 == 0:
            shared.send(topic, f"{topic}{i}", group, producer, seq)
    shared.flush()
    logs = {t: shared.main_log(t) for t in "ab"}

    # When the job reads the shared log
    with shared.running_job(shared.settings()):
        for topic, log in logs.items():
            log.wait_for_ids({m for ids in expected[topic].values() for m in ids})

    # Then each topic's main log holds its own messages, each once, every group in order
    for topic, log in logs.items():
        assert per_group(log) == expected[topic]
        # And each record says where it came from: the shared log's partition and offset
        assert {e.ingest_log for _, _, e in log.records} == {shared.shared_log}
        assert {e.ingest_partition for _, _, e in log.records} <= {0, 1, 2}
        assert not any(name == H_TOPIC for h in log.raw_headers for name, _ in h)
    # And a producer's marks are its own in each topic: b's higher ones did not drop a's
    assert [shared.mark("a", f"p{p}") for p in range(4)] == [99] * 4
    assert [shared.mark("b", f"p{p}") for p in range(4)] == [1099] * 4


def test_a_shared_log_record_without_its_topic_is_skipped_and_the_rest_goes_on(
    shared: IngestWorld,
) -> None:
    # Given records in the shared log that name no topic, or one that is not a topic's
    shared.create_topic("a")
    log = shared.main_log("a")
    producer = Producer({"bootstrap.servers": shared.bootstrap})
    assert shared.shared_log is not None
    for n, topic in enumerate((None, b"setu.ingest", b"not a topic", b"setu.x.y.ingest")):
        envelope = Envelope(f"stray{n}", b"x")
        headers = envelope.kafka_headers()
        if topic is not None:
            headers.append((H_TOPIC, topic))
        producer.produce(shared.shared_log, envelope.body, key=envelope.key, headers=headers)
    assert producer.flush(30) == 0
    # And a message of topic a after them
    shared.send("a", "after", "g")
    shared.flush()
    # When the job runs, then the message after them arrives, and none of them anywhere near
    with shared.running_job(shared.settings()):
        log.wait_for_ids({"after"})
    assert log.ids() == ["after"]


def test_a_deleted_topics_records_in_the_shared_log_are_skipped(shared: IngestWorld) -> None:
    # Given topic gone deleted (retired) with records still in the shared log, and topic a
    shared.create_topic("gone")
    shared.create_topic("a")
    gone, a = shared.main_log("gone"), shared.main_log("a")
    shared.send("gone", "late", "g")
    shared.redis.sadd(keys.retired_ingest_topics(), names.ingest_topic(shared.project, "gone"))
    shared.send("a", "sentinel", "g")
    shared.flush()
    # When the job runs, then a's message arrives and gone's does not
    with shared.running_job(shared.settings()):
        a.wait_for_ids({"sentinel"})
    assert gone.read_ids() == set()


def test_records_left_in_a_topics_own_ingest_topic_before_a_switch_are_read_too(
    shared: IngestWorld,
) -> None:
    # Given a topic made before the switch, with its own ingest topic holding 3 records that
    # were never read, and 3 more produced to the shared log since the switch
    shared.create_topic("old")
    own = names.ingest_topic(shared.project, "old")
    for future in shared.admin.create_topics([NewTopic(own, 3, 1)]).values():
        future.result(timeout=30)
    shared.topics.append(own)
    producer = Producer({"bootstrap.servers": shared.bootstrap, "partitioner": "murmur2_random"})
    for n in range(3):
        envelope = Envelope(f"before{n}", b"x", group_id=f"g{n}")
        producer.produce(own, envelope.body, key=envelope.key, headers=envelope.kafka_headers())
    assert producer.flush(30) == 0
    for n in range(3):
        shared.send("old", f"after{n}", f"h{n}")
    shared.flush()
    log = shared.main_log("old")
    # When the job reads both, then all six are in the main log, once each
    with shared.running_job(shared.settings()):
        log.wait_for_ids({f"before{n}" for n in range(3)} | {f"after{n}" for n in range(3)})
    assert sorted(log.ids()) == sorted({*log.ids()})
    assert {e.ingest_log for _, _, e in log.records} == {None, shared.shared_log}


@pytest.fixture
def shared_process(kafka_bootstrap: str, redis_url: str, tmp_path: Path) -> Iterator[IngestWorld]:
    # The job runs as `setu ingest`, a process of its own: no session in this one.
    world = IngestWorld(
        cast(SparkSession, None), kafka_bootstrap, redis_url, tmp_path, shared_partitions=2
    )
    yield world
    world.redis.set(keys.producer_marks_loaded(), "1")
    world.close()


def test_with_the_shared_log_many_topics_stay_in_real_time_mode(
    shared_process: IngestWorld, tmp_path: Path
) -> None:
    # Given the job allowed 3 ingest partitions in real-time mode, on a shared log of 2
    world = shared_process
    env = {**world.shared_env(), "SETU_SPARK_REALTIME_MAX_PARTITIONS": "3"}
    job = run_ingest(world, tmp_path, env=env, pattern=world.ingest_pattern())
    try:
        # When 12 topics of 3 partitions each (36 of their own, were they per topic) are
        # created while it runs, and each gets a message
        topics = [f"t{n}" for n in range(12)]
        for topic in topics:
            world.create_topic(topic, partitions=3)
            world.send(topic, f"m-{topic}", "g")
        world.flush()
        # Then every message reaches its main log, and the query never left real-time mode
        for topic in topics:
            world.main_log(topic).wait_for_ids({f"m-{topic}"}, 180)
        tail = job.log_tail(400)
        assert "started in real-time mode" in tail and "micro-batch mode" not in tail
        assert job.running(), job.log_tail()
    finally:
        job.stop()
