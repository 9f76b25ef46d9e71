"""``setu ingest`` in both its modes (spark/operator_job.py, decisions 0008 and 0009), as a process
of its own: it takes over from the checkpoint the Python micro-batch job of earlier versions left
with nothing lost or doubled, and the producer marks reach Redis, and come back when Redis
forgets them, from the changelog."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import httpx
import pytest
from pyspark.sql import SparkSession

from cli.ports import any_free_port
from setu import names
from setu.partitioner import partition_for
from state import keys
from state.producer_marks import ProducerMarks
from tests.integration.delivery.support import scrape
from tests.integration.spark.support import IngestWorld, earlier_checkpoint, run_ingest, wait_for

pytestmark = [pytest.mark.spark]


@pytest.fixture
def world(kafka_bootstrap: str, redis_url: str, tmp_path: Path) -> Iterator[IngestWorld]:
    # The job runs as `setu ingest`, a process of its own: no session in this one.
    world = IngestWorld(cast(SparkSession, None), kafka_bootstrap, redis_url, tmp_path)
    yield world
    world.redis.set(keys.producer_marks_loaded(), "1")
    world.close()


def decided(port: int) -> tuple[float, float] | None:
    """The ingest job's (accepted, duplicate) count of topic t, None while it does not serve."""
    try:
        got = scrape(port)
    except httpx.HTTPError:
        return None
    counts = [
        value
        for (name, labels), value in sorted(got.items())
        if name == "setu_ingest_messages_total" and ("topic", "t") in labels
    ]
    return (counts[0], counts[1]) if len(counts) == 2 else None


def batches(port: int) -> float:
    return scrape(port).get(("setu_ingest_batches_total", ()), 0.0)


@pytest.mark.parametrize("mode", ["micro-batch", "real-time"])
def test_the_job_takes_over_an_earlier_versions_checkpoint_with_nothing_lost_or_doubled(
    world: IngestWorld, tmp_path: Path, mode: str
) -> None:
    # Given an earlier version's job accepted p's sequences 1..3 (group g1) and q's 1 (g2), on
    # the two partitions of topic t, and committed that batch
    world.create_topic("t", partitions=2)
    for sequence in (1, 2, 3):
        world.send("t", f"p{sequence}", producer_id="p", sequence_id=sequence, group_id="g1")
    world.send("t", "q1", producer_id="q", sequence_id=1, group_id="g2")
    world.flush()
    ingest = names.ingest_topic(world.project, "t")
    p_at, q_at = (partition_for(group.encode(), 2) for group in ("g1", "g2"))
    assert p_at != q_at
    ends = {p_at: 3, q_at: 1}
    marks = {"p": {p_at: 3}, "q": {q_at: 1}}
    earlier_checkpoint(str(tmp_path / "checkpoint"), ingest, ends, marks, int(time.time() * 1000))
    # When p resends 3 and sends 4 while no job runs, and this version's job starts
    world.send("t", "p3", producer_id="p", sequence_id=3, group_id="g1")
    world.send("t", "p4", producer_id="p", sequence_id=4, group_id="g1")
    world.flush()
    log = world.main_log("t")
    port = any_free_port()
    job = run_ingest(
        world, tmp_path, mode, metrics_port=port, env={"SETU_SPARK_REALTIME_BATCH_S": "300"}
    )
    try:
        # Then p4 reaches the main log, and neither what the earlier job read nor the resend of
        # p3 does (the state seeded from its marks)
        log.wait_for_ids({"p4"}, 180)
        wait_for("p's mark", lambda: world.mark("t", "p") == 4, 60)
        # And the metrics count both within seconds
        wait_for("the counts", lambda: decided(port) == (1, 1), 20)
        # When p sends 5
        ended = batches(port)
        world.send("t", "p5", producer_id="p", sequence_id=5, group_id="g1")
        world.flush()
        log.wait_for_ids({"p5"}, 60)  # the sentinel: anything before it was read too
        # Then the metrics count it within seconds too: in real-time mode while the batch that
        # decided it still runs (a batch lasts SETU_SPARK_REALTIME_BATCH_S, 300 s here)
        wait_for("p5 counted", lambda: decided(port) == (2, 1), 20)
        if mode == "real-time":
            assert batches(port) == ended
        assert log.ids() == ["p4", "p5"]
        # And when Redis forgets every mark, they come back: q's too, which this job never saw
        # a message of (the take-over wrote the seeded marks to the changelog)
        world.redis.delete(keys.producer_marks(world.project, "t"), keys.producer_marks_loaded())
        wait_for("the marker", lambda: ProducerMarks(world.redis).all_loaded(), 60)
        assert world.mark("t", "p") == 5
        assert world.mark("t", "q") == 1
        assert job.running(), job.log_tail()
    finally:
        job.stop()


def test_a_topic_that_takes_the_job_past_its_task_slots_is_read_once_it_has_more(
    world: IngestWorld, tmp_path: Path
) -> None:
    # Given the job in real-time mode on a local master of 4 threads, and no topic yet
    job = run_ingest(world, tmp_path, env={"SETU_SPARK_REALTIME_SLOTS": "4"})
    try:
        wait_for("the query", lambda: "started in real-time mode" in job.log_tail(400), 120)
        # When a topic of 4 partitions is created (4 partitions and 2 shuffle partitions: 6
        # slots) and written to
        world.create_topic("wide", partitions=4)
        log = world.main_log("wide")
        for n in range(8):
            world.send("wide", f"w{n}", group_id=f"g{n}")
        world.flush()
        # Then the job starts Spark again with more threads, and every message gets through
        log.wait_for_ids({f"w{n}" for n in range(8)}, 180)
        assert "starting Spark again with more" in job.log_tail(400)
        assert job.running(), job.log_tail()
    finally:
        job.stop()


def test_past_its_partition_limit_the_job_goes_on_in_micro_batches(
    world: IngestWorld, tmp_path: Path
) -> None:
    # Given the job in real-time mode allowed 3 ingest partitions, reading topic a (2)
    world.create_topic("a", partitions=2)
    a = world.main_log("a")
    job = run_ingest(world, tmp_path, env={"SETU_SPARK_REALTIME_MAX_PARTITIONS": "3"})
    try:
        world.send("a", "a1", producer_id="p", sequence_id=1, group_id="g")
        world.flush()
        a.wait_for_ids({"a1"}, 180)
        assert "started in real-time mode" in job.log_tail(400)
        # When topic b (2 more) takes the job past its limit, and both get messages, p's
        # resend of 1 among them
        world.create_topic("b", partitions=2)
        b = world.main_log("b")
        wait_for("micro-batches", lambda: "started in micro-batch mode" in job.log_tail(400), 120)
        world.send("a", "a1", producer_id="p", sequence_id=1, group_id="g")
        world.send("a", "a2", producer_id="p", sequence_id=2, group_id="g")
        world.send("b", "b1", group_id="g")
        world.flush()
        # Then the query goes on in micro-batches from the same checkpoint: nothing lost, and
        # the resend dropped (what the stopped real-time batch wrote may be written again, at
        # the same ingest offsets, for delivery to skip)
        a.wait_for_ids({"a2"}, 120)
        b.wait_for_ids({"b1"}, 120)
        positions = [(e.ingest_partition, e.ingest_offset, e.message_id) for _, _, e in a.records]
        assert [m for _, _, m in dict.fromkeys(positions)] == ["a1", "a2"]
        assert job.running(), job.log_tail()
    finally:
        job.stop()


def test_a_job_stopped_before_any_topic_existed_starts_again_and_reads_the_topic_made_since(
    world: IngestWorld, tmp_path: Path
) -> None:
    # Given the job ran before any topic of its project existed, and committed a batch then
    # (`setu dev up` on a new data dir, stopped before anything was produced)
    env = {"SETU_SPARK_REALTIME_BATCH_S": "5"}  # the shortest Spark allows
    commits = tmp_path / "checkpoint" / "operator" / "commits"
    first = run_ingest(world, tmp_path, env=env)
    try:
        wait_for("a committed batch", lambda: commits.is_dir() and any(commits.iterdir()), 120)
    finally:
        first.stop()
    # When a topic is made and written to, and the job starts again on the same checkpoint
    world.create_topic("t", partitions=1)
    world.send("t", "m1", producer_id="p", sequence_id=1, group_id="g")
    world.flush()
    log = world.main_log("t")
    again = run_ingest(world, tmp_path, env=env)
    try:
        # Then it runs, and the message reaches the main log
        log.wait_for_ids({"m1"}, 180)
        assert again.running(), again.log_tail()
        assert "ingest query failed" not in again.log_tail(400)
    finally:
        again.stop()
