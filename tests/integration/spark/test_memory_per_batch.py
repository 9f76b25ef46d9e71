"""`setu ingest` with a small heap against a burst of large, compressible messages: memory per
batch is bounded in bytes, whatever the compression ratio (docs/ingest.md, "Memory per
batch"). A security probe once sent 0.92 GiB of such messages (a few MB on disk) in 10 s and
the shared job crash-looped on that batch with ``OutOfMemoryError: Java heap space``."""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest
from confluent_kafka import KafkaException, Producer
from pyspark.sql import SparkSession

from cli.processes import Child, ChildSpec
from setu.limits import DEFAULT_MAX_MESSAGE_BYTES, MessageLimits
from state.kafka_admin import topic_config
from tests.integration.spark.support import IngestWorld, ingest_child, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.spark]

HEAP = "512m"
BURST = 1280  # messages of the largest body the API takes: 1.25 GiB, 2.5 times the heap


def main_size(world: IngestWorld) -> int:
    """Records in the world's main topic ``t``; -1 while its partition has no leader yet."""
    try:
        return world.main_size("t")
    except KafkaException:
        return -1


def project_pair_pattern(*worlds: IngestWorld) -> str:
    return "^setu\\.(" + "|".join(w.project for w in worlds) + ")\\.[a-z0-9-]+\\.ingest$"


@pytest.fixture
def two_projects(
    kafka_bootstrap: str, redis_url: str, tmp_path: Path
) -> Iterator[tuple[IngestWorld, IngestWorld]]:
    # The job runs in a process of its own (its heap is set when its JVM starts): no session
    # in this one.
    worlds = tuple(
        IngestWorld(cast(SparkSession, None), kafka_bootstrap, redis_url, tmp_path)
        for _ in range(2)
    )
    yield worlds[0], worlds[1]
    for world in worlds:
        world.close()


def ingest_spec(pattern: str, world: IngestWorld, tmp_path: Path) -> ChildSpec:
    # In local mode the tasks run in the driver's JVM: its heap is the job's heap.
    conf = {"spark.driver.memory": HEAP}
    return ingest_child(world, tmp_path, master="local[2]", pattern=pattern, conf=conf)


class Watch:
    """The resident memory of the job's JVM, sampled until stopped; its peak."""

    def __init__(self, root: int) -> None:
        self.root, self.peak, self.heap = root, 0, ""
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def jvms(self) -> list[int]:
        found = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            # A JVM in the job's process group
            if int(stat[2]) == self.root and cmdline[0].endswith(b"java"):
                found.append(int(pid))
                heap = [a.decode() for a in cmdline if a.startswith(b"-Xmx")]
                self.heap = heap[-1] if heap else self.heap
        return found

    def run(self) -> None:
        while not self.stopped.wait(0.5):
            for pid in self.jvms():
                try:
                    status = Path(f"/proc/{pid}/status").read_text()
                except OSError:
                    continue
                rss = next(line for line in status.splitlines() if line.startswith("VmRSS"))
                self.peak = max(self.peak, int(rss.split()[1]) * 1024)

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(5)


@pytest.mark.finding("H3")
def test_a_burst_of_large_compressible_messages_over_the_heap_goes_through(
    two_projects: tuple[IngestWorld, IngestWorld], tmp_path: Path
) -> None:
    # Given a burst already waiting in the ingest topic when the job starts, so that its
    # first batch takes all of it: one producer key's 1.25 GiB of compressible messages at the
    # API's largest body (a few MB on disk), and a few small messages of another project
    loud, quiet = two_projects
    config = topic_config(168, 1, DEFAULT_MAX_MESSAGE_BYTES)
    loud.create_topic("t", partitions=1, config=config)
    quiet.create_topic("t", partitions=1, config=config)
    loud.producer = Producer(
        {
            "bootstrap.servers": loud.bootstrap,
            "compression.type": "lz4",
            "linger.ms": 50,
            "message.max.bytes": MessageLimits(DEFAULT_MAX_MESSAGE_BYTES).request_bytes,
        }
    )
    body = b"x" * DEFAULT_MAX_MESSAGE_BYTES
    for i in range(BURST):
        loud.send("t", f"big-{uuid.uuid4().hex}", "g", "p", i, body=body)
        if i % 64 == 63:
            loud.flush()
    loud.flush()
    for i in range(3):
        quiet.send("t", f"small-{i}", producer_id="q", sequence_id=i)
    quiet.flush()
    # When `setu ingest` starts with a 512 MiB heap, reading both projects' topics
    ingest = Child(ingest_spec(project_pair_pattern(loud, quiet), loud, tmp_path))
    ingest.start()
    assert ingest.pid is not None
    watch = Watch(ingest.pid)
    started = time.monotonic()
    try:
        # Then both projects' messages reach their main topics (counted by the topics'
        # offsets: reading 1.25 GiB back would be the slow part), and the job never failed
        wait_for("the small messages in the main log", lambda: main_size(quiet) == 3, 900)
        wait_for("the burst in the main log", lambda: main_size(loud) >= BURST, 900)
        took = time.monotonic() - started
        assert ingest.running()
    finally:
        watch.stop()
        ingest.stop()
    output = ingest.spec.log_path.read_text(errors="replace")
    assert "OutOfMemoryError" not in output
    assert "ingest query failed" not in output
    assert loud.main_size("t") == BURST
    assert watch.heap == f"-Xmx{HEAP}"
    print(
        f"\nmemory: {BURST} x {DEFAULT_MAX_MESSAGE_BYTES >> 20} MiB through a {HEAP} heap in "
        f"{took:.0f} s, JVM peak RSS {watch.peak / 2**20:.0f} MiB"
    )
