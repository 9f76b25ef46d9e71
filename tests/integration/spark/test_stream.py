"""The ingest query through the JVM de-duplication operator (spark/stream.py, decision 0008),
against the real broker and Spark, in micro-batches."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import NewTopic
from pyspark.sql.streaming.query import StreamingQuery

from setu.settings import Settings
from spark import job, stream
from spark.migration import last_committed, seed_marks, starting_offsets
from tests.integration.spark.support import IngestWorld, earlier_checkpoint, wait_for


@contextmanager
def running(world: IngestWorld, settings: Settings, counts: Any = None) -> Iterator[StreamingQuery]:
    pattern = job.project_pattern(world.project)
    query = stream.start(world.spark, settings, pattern, realtime=False, counts=counts)
    try:
        yield query
    finally:
        job.stop_between_batches(query)


def marks_topic(world: IngestWorld) -> None:
    """The producer marks changelog, as the job makes it (compacted)."""
    listed = world.admin.list_topics(timeout=10).topics
    if stream.MARKS_TOPIC not in listed:
        created = world.admin.create_topics(
            [NewTopic(stream.MARKS_TOPIC, 1, 1, config={"cleanup.policy": "compact"})]
        )
        for future in created.values():
            with suppress(KafkaException):  # another test made it meanwhile
                future.result(timeout=30)


def marks_of(world: IngestWorld) -> dict[bytes, list[bytes]]:
    """Every mark the changelog holds for ``world``'s project: key -> values in order."""
    consumer = Consumer({"bootstrap.servers": world.bootstrap, "group.id": "marks-reader"})
    try:
        consumer.assign([TopicPartition(stream.MARKS_TOPIC, 0, 0)])
        _, end = consumer.get_watermark_offsets(TopicPartition(stream.MARKS_TOPIC, 0), timeout=10)
        found: dict[bytes, list[bytes]] = {}
        mine = f"setu.{world.project}.".encode()
        position = 0
        while position < end:
            for message in consumer.consume(500, timeout=1):
                if message.error() is None:
                    position = message.offset() + 1
                    key = message.key() or b""
                    if key.startswith(mine):
                        found.setdefault(key, []).append(message.value() or b"")
        return found
    finally:
        consumer.close()


def test_resends_are_dropped_by_sequence_and_by_message_id_and_order_and_marks_hold(
    world: IngestWorld,
) -> None:
    # Given a topic of one partition, and a resend of each kind among new messages
    marks_topic(world)
    world.create_topic("t", partitions=1)
    world.send("t", "a1", producer_id="p", sequence_id=1)
    world.send("t", "a1", producer_id="p", sequence_id=1)
    world.send("t", "a2", producer_id="p", sequence_id=2)
    world.send("t", "m1", dedup_window_ms=60_000)
    world.send("t", "m1", dedup_window_ms=60_000)
    world.send("t", "m2")
    world.send("t", "m2")
    world.flush()
    log = world.main_log("t")
    counts = stream.topic_counts(world.spark)
    with running(world, world.settings(), counts):
        # Then each message is in its main log once, in produce order: a resent sequence is
        # dropped, a resent message id within its topic's window too, and a topic without a
        # window keeps every copy
        log.wait_for_ids({"a1", "a2", "m1", "m2"})
        wait_for("the second copy of m2", lambda: log.poll() or len(log.ids()) >= 5)
    assert log.ids() == ["a1", "a2", "m1", "m2", "m2"]
    # And every main record carries its ingest position
    assert [(e.ingest_partition, e.ingest_offset) for _, _, e in log.records] == [
        (0, 0),
        (0, 2),
        (0, 3),
        (0, 5),
        (0, 6),
    ]
    # And the producer's mark followed each record it kept
    ingest = f"setu.{world.project}.t.ingest"
    assert marks_of(world) == {f"{ingest}/0/p".encode(): [b"0:1", b"0:2"]}
    # And the decisions were counted for the metrics (Spark adds a task's counts as it ends)
    wait_for("the counts", lambda: stream.read_counts(counts) == {ingest: (5, 2)})


def test_a_query_started_again_remembers_what_it_kept(world: IngestWorld) -> None:
    marks_topic(world)
    world.create_topic("t", partitions=1)
    world.send("t", "a1", producer_id="p", sequence_id=1)
    world.flush()
    log = world.main_log("t")
    settings = world.settings()
    with running(world, settings):
        log.wait_for_ids({"a1"})
    # When the producer resends after the query was stopped and started again
    world.send("t", "a1", producer_id="p", sequence_id=1)
    world.send("t", "a2", producer_id="p", sequence_id=2)
    world.flush()
    with running(world, settings):
        log.wait_for_ids({"a2"})
    # Then the resend was dropped: the operator's state came back from the checkpoint
    assert log.ids() == ["a1", "a2"]


def test_a_query_taking_over_from_the_micro_batch_job_loses_and_doubles_nothing(
    world: IngestWorld,
) -> None:
    # Given the micro-batch job committed its batch 0, having read the ingest partition up to
    # offset 1 and accepted sequence 5 of producer p
    marks_topic(world)
    world.create_topic("t", partitions=1)
    ingest = f"setu.{world.project}.t.ingest"
    settings = world.settings()
    old = settings.resolved_checkpoint_dir()
    earlier_checkpoint(old, ingest, {0: 1}, {"p": {0: 5}}, int(time.time() * 1000))
    world.send("t", "a5", producer_id="p", sequence_id=5)
    world.send("t", "a5", producer_id="p", sequence_id=5)  # the producer's resend
    world.send("t", "a6", producer_id="p", sequence_id=6)
    world.flush()
    # When the operator query starts on a checkpoint of its own, where the old one stopped
    committed = last_committed(old)
    seeds = stream.initial_state(world.spark, seed_marks(old, committed))
    log = world.main_log("t")
    query = stream.start(
        world.spark,
        world.settings(spark_checkpoint_dir=f"{old}/operator"),
        job.project_pattern(world.project),
        realtime=False,
        initial=seeds,
        starting=starting_offsets(committed, {ingest: 1}),
    )
    try:
        log.wait_for_ids({"a6"})
    finally:
        job.stop_between_batches(query)
    # Then it read on from offset 1 (the old job wrote a5), and the resend was a duplicate of
    # what the old job accepted
    assert log.ids() == ["a6"]


def test_the_takeover_seed_needs_no_python_worker(world: IngestWorld) -> None:
    # Given the marks of a micro-batch checkpoint's partitions, as a takeover seeds them
    seeds = [("setu.p.t.ingest", 0, "marks-0"), ("setu.p.t.ingest", 1, "m" * 100_000)]
    # When they become the operator's initial state
    state = stream.initial_state(world.spark, seeds)
    assert state is not None
    # Then they are rows of the JVM alone, in one partition: no Python RDD whose every
    # partition takes a Python worker for the batch (64 of them took an upgraded ingest pod
    # past its memory limit)
    plan = str(state._jdf.queryExecution().executedPlan().toString())
    assert "PythonRDD" not in plan and "ExistingRDD" not in plan, plan[:2000]
    assert state.rdd.getNumPartitions() == 1
    assert [tuple(row) for row in state.collect()] == seeds
    assert state.schema.simpleString() == "struct<topic:string,partition:int,marks:string>"
