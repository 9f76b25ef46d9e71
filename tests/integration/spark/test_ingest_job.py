"""The ingest job end to end (``spark.job.serve`` in real-time mode, Setu's default): ingest topic
-> Spark -> main log (+ producer marks in Redis)."""

from __future__ import annotations

import itertools
import threading
import time
from collections import defaultdict

import pytest
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

from setu import names
from setu.envelope import H_INGEST_OFFSET, H_INGEST_PARTITION
from spark import job
from spark.dedup import SHARES
from spark.rejects import REASON_HEADER
from spark.topics import MainTopicGuard
from state.kafka_admin import topic_config
from tests.integration.spark.support import IngestWorld, MainLog, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def per_group(log: MainLog) -> dict[str, list[str]]:
    groups: dict[str, list[str]] = defaultdict(list)
    for _, _, envelope in log.records:
        groups[envelope.group_id or envelope.message_id].append(envelope.message_id)
    return groups


def test_retries_and_older_sequences_are_dropped_and_marks_published(world: IngestWorld) -> None:
    # Given a running job and a producer that sends 0..9, retries seq 3, plus an anonymous message
    world.create_topic("t")
    log = world.main_log("t")
    with world.running_job(world.settings()):
        for seq in range(10):
            world.send("t", f"m{seq}", f"g{seq % 3}", "p1", seq)
        world.send("t", "m3", "g0", "p1", 3)
        world.send("t", "free")
        world.flush()
        # Then each message is in the main log once and the mark says 9
        log.wait_for_ids({f"m{s}" for s in range(10)} | {"free"})
        wait_for("mark 9", lambda: world.mark("t", "p1") == 9)

        # When the producer resends its last message, sends an older sequence, then seq 10
        world.send("t", "m9", "g0", "p1", 9)
        world.send("t", "stale", "g1", "p1", 4)
        world.send("t", "m10", "g1", "p1", 10)
        world.flush()
        log.wait_for_ids({"m10"})
        wait_for("mark 10", lambda: world.mark("t", "p1") == 10)
        # And within seconds the job's metrics count 12 accepted and 3 duplicates (m3, m9 and
        # the stale 4), while its batch still runs
        topic = f'project="{world.project}",result="%s",topic="t"'
        counted = [
            f"setu_ingest_messages_total{{{topic % 'accepted'}}} 12.0",
            f"setu_ingest_messages_total{{{topic % 'duplicate'}}} 3.0",
        ]
        wait_for("the counts", lambda: all(c in world.metrics.render().decode() for c in counted))

    # Then neither the retry nor the older sequence reached the main log
    ids = log.ids()
    assert sorted(ids) == sorted([f"m{s}" for s in range(11)] + ["free"])
    for _partition, key, envelope in log.records:
        # Key = GroupId else MessageId; producer headers kept; ingest position added
        assert key == (envelope.group_id or envelope.message_id).encode()
        assert envelope.headers == (("X_TRACE", envelope.message_id),)
        assert envelope.ingest_partition is not None and envelope.ingest_offset is not None
        assert envelope.body == f"body of {envelope.message_id}".encode()
    header_names = {name for name, _ in log.records[0][2].kafka_headers()}
    assert {H_INGEST_PARTITION, H_INGEST_OFFSET} <= header_names
    # And the counts stayed once the job stopped (a stopped batch's tasks take theirs away)
    scrape = world.metrics.render().decode()
    assert all(c in scrape for c in counted)


def test_each_group_keeps_ingest_order_with_many_interleaved_producers(
    world: IngestWorld,
) -> None:
    # Given 6 producers writing 12 interleaved groups, every 10th message retried at once
    world.create_topic("orders", partitions=3)
    expected: dict[str, list[str]] = defaultdict(list)
    for i in range(1200):
        producer, group, seq = f"p{i % 6}", f"g{(i * 7) % 12}", i // 6
        world.send("orders", f"m{i}", group, producer, seq)
        expected[group].append(f"m{i}")
        if i % 10 == 0:
            world.send("orders", f"m{i}", group, producer, seq)
    world.flush()
    log = world.main_log("orders")

    # When the job reads them
    with world.running_job(world.settings()):
        log.wait_for_ids({m for ids in expected.values() for m in ids})

    # Then every group is in the main log exactly once per message, in produce order
    assert per_group(log) == expected
    for p in range(6):
        assert world.mark("orders", f"p{p}") == 199


def test_restarted_query_loses_nothing_and_replays_exactly(world: IngestWorld) -> None:
    # Given a job that is stopped mid-stream while producers keep writing
    world.create_topic("k", partitions=3)
    expected: dict[str, list[str]] = defaultdict(list)
    for i in range(3000):
        expected[f"g{(i * 11) % 30}"].append(f"m{i}")

    def produce() -> None:
        for i in range(3000):
            world.send("k", f"m{i}", f"g{(i * 11) % 30}", f"p{i % 5}", i // 5)
            if i % 100 == 99:
                world.flush()
                time.sleep(0.05)
        world.flush()

    log = world.main_log("k")
    settings = world.settings()
    writer = threading.Thread(target=produce)
    with world.running_job(settings):
        writer.start()

        def some_written() -> bool:
            log.poll()
            return len(log.records) >= 300

        wait_for("a first part of the stream", some_written)
    # (the stop ends the running batch uncommitted: what it wrote is replayed after the restart)

    # When the job restarts from its checkpoint
    with world.running_job(settings):
        writer.join()
        log.wait_for_ids({m for ids in expected.values() for m in ids})
        # And a producer retries a message accepted before the restart, then sends a new one
        world.send("k", "m0", "g0", "p0", 0)
        world.send("k", "fresh", "g0", "p0", 600)
        world.flush()
        log.wait_for_ids({"fresh"})

    # Then nothing is lost, and within each group the log only ever moves one step forward or
    # goes back to replay a stretch in the same order (never skips, never reorders)
    expected["g0"].append("fresh")
    raw = per_group(log)
    assert {g: sorted(set(ids)) for g, ids in raw.items()} == {
        g: sorted(ids) for g, ids in expected.items()
    }
    for group, ids in raw.items():
        position = {m: n for n, m in enumerate(expected[group])}
        steps = [position[b] - position[a] for a, b in itertools.pairwise(ids)]
        assert all(step <= 1 for step in steps), group
        assert ids[0] == expected[group][0]
    # (Had the retry of m0 been kept, g0 would step from m0 straight to "fresh".)


def test_idle_producers_expire_and_the_tracked_number_is_bounded(world: IngestWorld) -> None:
    # Given a job with a 3 s TTL and room for one producer per partition
    world.create_topic("ttl")
    log = world.main_log("ttl")
    a, b = "producer-a", "producer-b"  # one group: one partition
    settings = world.settings(dedup_ttl_seconds=3, dedup_max_producers=SHARES)
    with world.running_job(settings):
        # When producer a goes idle for longer than the TTL
        world.send("ttl", "a5", "g", a, 5)
        world.flush()
        log.wait_for_ids({"a5"})
        time.sleep(4)  # the TTL itself: record time has to pass it
        world.send("ttl", "a2", "g", a, 2)
        world.flush()
        # Then its state is gone and an older sequence is accepted as new
        log.wait_for_ids({"a2"})

        # When producer b takes the only place in the partition
        world.send("ttl", "b1", "g", b, 1)
        world.flush()
        log.wait_for_ids({"b1"})
        world.send("ttl", "a1", "g", a, 1)
        world.flush()
        # Then a was forgotten (least recently seen) and its older sequence passes again
        log.wait_for_ids({"a1"})
    assert log.ids() == ["a5", "a2", "b1", "a1"]


def test_topic_created_while_the_job_runs_is_picked_up(world: IngestWorld) -> None:
    # Given a job running, seen to write the project's first topic
    world.create_topic("first")
    first = world.main_log("first")
    settings = world.settings(spark_topic_refresh_ms=1000)
    with world.running_job(settings):
        world.send("first", "f1")
        world.flush()
        first.wait_for_ids({"f1"})
        # When a topic is created and written to
        world.create_topic("late")
        log = world.main_log("late")
        world.send("late", "x1", "g", "p", 0)
        world.flush()
        # Then its messages reach the main log without a restart of the job
        log.wait_for_ids({"x1"})
        wait_for("mark 0", lambda: world.mark("late", "p") == 0)


def test_a_body_of_exactly_the_size_limit_goes_through_and_ingest_goes_on(
    world: IngestWorld,
) -> None:
    # Given topics configured as the API creates them, and a message whose body is exactly
    # SETU_MAX_MESSAGE_BYTES (the API answers 200 to it), then a small one
    settings = world.settings()
    config = topic_config(168, 1, settings.max_message_bytes)
    world.create_topic("t", config=config)
    log = world.main_log("t")
    with world.running_job(settings):
        world.send("t", "big", "g", "p", 0, body=b"b" * settings.max_message_bytes)
        world.send("t", "after", "g", "p", 1)
        world.flush()
        # Then both reach the main log, in order, the big one whole (the sink's request limit
        # once refused it, and the job replayed that batch forever)
        log.wait_for_ids({"big", "after"})
    assert [e.message_id for _, _, e in log.records] == ["big", "after"]
    assert len(log.records[0][2].body) == settings.max_message_bytes


def test_a_record_its_main_topic_cannot_take_is_set_aside_and_ingest_goes_on(
    world: IngestWorld,
) -> None:
    # Given topic t whose main topic's max.message.bytes was lowered by hand to 4 KiB, and
    # another topic u as the API made it
    settings = world.settings()
    world.create_topic("t")
    world.create_topic("u", config=topic_config(168, 1, settings.max_message_bytes))
    main_t = names.main_topic(world.project, "t")
    limit = ConfigEntry("max.message.bytes", "4096", incremental_operation=AlterConfigOpType.SET)
    resource = ConfigResource(ConfigResource.Type.TOPIC, main_t, incremental_configs=[limit])
    world.admin.incremental_alter_configs([resource])[resource].result(timeout=30)
    guard = MainTopicGuard(world.bootstrap, job.project_pattern(world.project), interval_s=0.2)
    guard.start()
    rejects_topic = names.ingest_rejects_topic(world.project, "t")
    world.topics.append(rejects_topic)
    try:
        wait_for("the guard read t's limit", lambda: guard.limits().get(main_t) == 4096)
        main, other = world.main_log("t"), world.main_log("u")
        rejects = world.log_of(rejects_topic)
        # When a producer sends a small message, one of 10 KB and another small one to t, and
        # one to u
        with world.running_job(settings):
            world.send("t", "s1", "g", "p", 0)
            world.send("t", "big", "g", "p", 1, body=b"b" * 10_000)
            world.send("t", "s2", "g", "p", 2)
            world.send("u", "u1", "g", "p", 0)
            world.flush()
            # Then the small ones reach t's main log in order, u goes on, and the big one is
            # set aside in t's reject topic with its reason
            main.wait_for_ids({"s1", "s2"})
            other.wait_for_ids({"u1"})
            rejects.wait_for_ids({"big"})
            wait_for("the mark counts the set-aside record", lambda: world.mark("t", "p") == 2)
            wait_for("the guard counts it", lambda: guard.rejects().get(ingest_of("t", world)) == 1)
    finally:
        guard.stop()
    assert main.ids() == ["s1", "s2"]
    [(_, _, envelope)] = rejects.records
    assert len(envelope.body) == 10_000
    reasons = [v for k, v in rejects.raw_headers[0] if k == REASON_HEADER]
    assert reasons and b"over the 4096 bytes its main topic" in reasons[0]


def ingest_of(topic: str, world: IngestWorld) -> str:
    return names.ingest_topic(world.project, topic)


def test_a_hot_topics_backlog_does_not_hold_a_quiet_topic_back(world: IngestWorld) -> None:
    # Given a hot topic with a backlog of 100,000 records
    world.create_topic("hot")
    world.create_topic("quiet")
    backlog = 100_000
    for n in range(backlog):
        world.send("hot", f"h{n}", f"g{n % 50}")
    world.flush()
    hot = world.main_log("hot")
    quiet = world.main_log("quiet")
    with world.running_job(world.settings()):
        hot.wait_for_ids({"h0"})
        # When a quiet topic gets one message while the backlog drains
        world.send("quiet", "q1", "g1")
        world.flush()
        quiet.wait_for_ids({"q1"})
        # Then it is written while the backlog is still being written: each ingest partition is
        # read by a task of its own, and no bound of a batch shares them out
        assert world.main_size("hot") < backlog
        hot.wait_for_ids({f"h{n}" for n in range(backlog)}, 300)


def test_a_topic_deleted_and_created_again_starts_without_its_old_producers(
    world: IngestWorld,
) -> None:
    # Given producer p's messages 0..4 on topic t (created at time 1), ingested
    world.create_topic("t")
    old = {f"old{seq}" for seq in range(5)}
    with world.running_job(world.settings()):
        for seq in range(5):
            world.send("t", f"old{seq}", f"g{seq}", "p", seq, incarnation=1)
        world.flush()
        world.main_log("t").wait_for_ids(old)
        wait_for("p's mark at 4", lambda: world.marked("t", "p") == (1, 4))
        # When t is deleted and created again (at time 2) and p starts over from 0
        world.delete_topic("t")
        world.create_again("t")
        for seq in range(3):
            world.send("t", f"new{seq}", f"g{seq}", "p", seq, incarnation=2)
        world.flush()
        # Then its new messages are not taken for duplicates of the old ones, and its mark
        # is the new topic's
        log = world.main_log("t")
        log.wait_for_ids({"new0", "new1", "new2"})
        wait_for("p's new mark", lambda: world.marked("t", "p") == (2, 2))
    assert sorted(log.ids()) == ["new0", "new1", "new2"]


def test_messages_reaching_a_deleted_topics_kept_ingest_log_are_skipped(
    world: IngestWorld,
) -> None:
    # Given topics a and b, ingested
    world.create_topic("a")
    world.create_topic("b")
    a, b = world.main_log("a"), world.main_log("b")
    with world.running_job(world.settings()):
        world.send("a", "a1", "g")
        world.send("b", "b1", "g")
        world.flush()
        a.wait_for_ids({"a1"})
        b.wait_for_ids({"b1"})
        # When a is deleted through the API and a message still reaches its kept ingest log
        # (an API replica that had not yet seen the delete), then b gets one
        world.delete_topic("a")
        world.send("a", "late", "g")
        world.send("b", "b2", "g")
        world.flush()
        # Then b's message is written after it, and ingest goes on without writing it
        b.wait_for_ids({"b2"})
    listed = world.admin.list_topics(timeout=10).topics
    assert names.main_topic(world.project, "a") not in listed
    assert a.ids() == ["a1"]
