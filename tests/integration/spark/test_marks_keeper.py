"""Producer marks come back when Redis forgets them, even while no message arrives.

Found by the long crash run: a Redis `FLUSHALL` while the only producer was restarting left it
waiting for ``GET .../producers/{id}`` (503 until the marks are back), while the ingest job
published them again only at its next batch, which waited for that producer's messages.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest
import redis
from pyspark.sql import SparkSession

from cli.processes import Child
from spark.dedup import ProducerMark, encode_marks
from spark.dedup_state import PartitionMarks
from spark.job import committed_marks
from spark.marks import MarkPublisher, MarksKeeper
from state import keys
from state.producer_marks import ProducerMarks
from tests.integration.spark.support import IngestWorld, ingest_child, wait_for

TOPIC = "setu.keeper.t.ingest"


def committed_batch(checkpoint: Path, batch: int, committed: bool) -> None:
    (checkpoint / "offsets").mkdir(parents=True, exist_ok=True)
    (checkpoint / "commits").mkdir(exist_ok=True)
    (checkpoint / "offsets" / str(batch)).write_text(f'v1\n{{}}\n{{"{TOPIC}":{{"0":{batch}}}}}')
    if committed:
        (checkpoint / "commits" / str(batch)).write_text("v1\n{}")


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis[bytes]]:
    c: redis.Redis[bytes] = redis.Redis.from_url(redis_url)
    yield c
    c.delete(keys.producer_marks("keeper", "t"))
    c.set(keys.producer_marks_loaded(), "1")
    c.close()


def test_the_marks_of_committed_batches_come_back_without_a_batch(
    tmp_path: Path, client: redis.Redis[bytes]
) -> None:
    # Given a checkpoint whose batch 3 committed p's sequence 7, and whose batch 4 (not
    # committed: it will run again) got as far as 9
    marks = PartitionMarks(str(tmp_path))
    marks.save(TOPIC, 0, 3, encode_marks({(TOPIC, "p"): ProducerMark({0: 7}, 1, 5)}))
    marks.save(TOPIC, 0, 4, encode_marks({(TOPIC, "p"): ProducerMark({0: 9}, 2, 5)}))
    committed_batch(tmp_path, 3, committed=True)
    committed_batch(tmp_path, 4, committed=False)
    publisher = MarkPublisher(client)
    keeper = MarksKeeper(
        publisher, lambda: committed_marks(str(tmp_path), frozenset()), interval_s=0.1
    ).start()
    try:
        # When Redis forgets everything
        client.delete(keys.producer_marks("keeper", "t"), keys.producer_marks_loaded())
        # Then the committed mark is back, and Redis says it holds every mark
        wait_for("the marker", ProducerMarks(client).all_loaded, 30)
        assert ProducerMarks(client).mark("keeper", "t", "p") == (5, 7)
    finally:
        keeper.stop()


@pytest.fixture
def idle_world(kafka_bootstrap: str, redis_url: str, tmp_path: Path) -> Iterator[IngestWorld]:
    # The job runs as `setu ingest`, a process of its own: no session in this one.
    world = IngestWorld(cast(SparkSession, None), kafka_bootstrap, redis_url, tmp_path)
    yield world
    world.close()


@pytest.mark.spark
def test_a_producer_waiting_for_its_mark_after_redis_forgot_gets_it_while_nothing_is_sent(
    idle_world: IngestWorld, tmp_path: Path
) -> None:
    world = idle_world
    world.create_topic("t", partitions=1)
    spec = ingest_child(
        world,
        tmp_path,
        master="local[2]",
        pattern=f"^setu\\.{world.project}\\.t\\.ingest$",
        conf={},
    )
    ingest = Child(spec)
    ingest.start()
    try:
        # Given the job accepted a producer's sequence 4
        world.send("t", "m4", producer_id="p", sequence_id=4)
        world.flush()
        wait_for("the producer's mark", lambda: world.mark("t", "p") == 4, 180)
        # When Redis forgets everything while the producer, its only one, waits to resume
        world.redis.delete(keys.producer_marks(world.project, "t"), keys.producer_marks_loaded())
        # Then its mark comes back with no message sent, and Redis holds every mark again
        wait_for("the marker", lambda: ProducerMarks(world.redis).all_loaded(), 60)
        assert world.mark("t", "p") == 4
        assert ingest.running(), ingest.log_tail()
    finally:
        ingest.stop()
        world.redis.set(keys.producer_marks_loaded(), "1")
