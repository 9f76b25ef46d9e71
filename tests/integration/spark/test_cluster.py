"""`setu ingest` on a real Spark standalone cluster (a master and two workers started from the
PySpark distribution), with a worker killed and the job itself killed mid-stream."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from cli.ports import any_free_port
from cli.processes import Child, ChildSpec
from cli.spark_local import LocalSparkCluster
from spark import job
from tests.integration.spark.support import IngestWorld, MainLog, ingest_child, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.long]

GROUPS = 24
PRODUCERS = 4
MESSAGES = 2400
RESEND_EVERY = 40  # every 40th message is sent twice (a producer retrying after a timeout)


@dataclass
class Cluster:
    spec: LocalSparkCluster
    logs: Path
    env: dict[str, str]
    master: Child | None = None
    workers: list[Child] = field(default_factory=list)

    def start(self) -> None:
        self.master = Child(self.spec.master_spec(self.logs / "master.log", self.env))
        self.master.start()
        for index in range(self.spec.workers):
            worker = Child(self.spec.worker_spec(index, self.logs / f"w{index}.log", self.env))
            worker.start()
            self.workers.append(worker)
        wait_for("both workers", lambda: self.spec.alive_workers() == self.spec.workers, 120)

    def kill_worker(self, index: int) -> None:
        """SIGKILL to the worker's process group: the worker and its executor, as when its
        machine goes away."""
        pid = self.workers[index].pid
        assert pid is not None
        os.killpg(pid, signal.SIGKILL)

    def stop(self) -> None:
        for child in [*self.workers, self.master]:
            if child is not None:
                child.stop()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    spec = LocalSparkCluster(
        tmp_path / "spark", port=any_free_port(), ui_port=any_free_port(), workers=2, memory="1g"
    )
    running = Cluster(spec, tmp_path / "logs", dict(os.environ))
    try:
        running.start()
        yield running
    finally:
        running.stop()


def ingest_spec(world: IngestWorld, cluster: Cluster, tmp_path: Path) -> ChildSpec:
    # The checkpoint (in tmp_path) stands in for storage every executor reaches, a shared
    # file system: the workers run on this machine.
    # One executor per worker, with all its slots: real-time mode holds one per partition.
    conf = {"spark.executor.memory": "512m"}
    pattern = job.project_pattern(world.project)
    return ingest_child(world, tmp_path, master=cluster.spec.master_url, pattern=pattern, conf=conf)


@dataclass
class Sent:
    """What the producer thread sent: per group, its message ids in order."""

    groups: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    resent: int = 0
    done: threading.Event = field(default_factory=threading.Event)

    @property
    def ids(self) -> set[str]:
        return {m for ids in self.groups.values() for m in ids}


def produce(world: IngestWorld, sent: Sent, per_second: float) -> None:
    sequences = [0] * PRODUCERS
    for i in range(MESSAGES):
        group, producer = f"g{i % GROUPS}", i % PRODUCERS
        message_id = f"m{i}"
        world.send("t", message_id, group, f"p{producer}", sequences[producer])
        sent.groups[group].append(message_id)
        if i % RESEND_EVERY == RESEND_EVERY - 1:
            world.send("t", message_id, group, f"p{producer}", sequences[producer])
            sent.resent += 1
        sequences[producer] += 1
        if i % 50 == 49:
            world.flush()
            time.sleep(50 / per_second)
    world.flush()
    sent.done.set()


def first_reads(log: MainLog) -> list[tuple[str, str]]:
    """(group, message id) of the main log in order, without the exact replays of a batch the
    job wrote again after it was killed (delivery skips those by ingest offset too)."""
    seen: set[tuple[int | None, int | None]] = set()
    out = []
    for _, _, envelope in log.records:
        position = (envelope.ingest_partition, envelope.ingest_offset)
        if position in seen:
            continue
        seen.add(position)
        out.append((envelope.group_id or "", envelope.message_id))
    return out


def test_ingest_on_a_cluster_rides_out_a_lost_worker_and_its_own_restart(
    world: IngestWorld, cluster: Cluster, tmp_path: Path
) -> None:
    # Given `setu ingest` running on the cluster, and producers sending 2,400 messages over
    # 24 groups, every 40th twice
    world.create_topic("t", partitions=4)
    log = world.main_log("t")
    ingest = Child(ingest_spec(world, cluster, tmp_path))
    ingest.start()
    sent = Sent()
    world.send("t", "first", "g0")
    world.flush()
    started = time.monotonic()
    log.wait_for_ids({"first"}, timeout_s=240)
    print(f"\ncluster: first message through after {time.monotonic() - started:.1f} s")
    producer = threading.Thread(target=produce, args=(world, sent, 60.0), daemon=True)
    producer.start()
    try:
        # When one worker dies (with its executor) while messages keep coming
        wait_for("a third through", lambda: len(log.read_ids()) > MESSAGES // 3, 240)
        cluster.kill_worker(0)
        killed = time.monotonic()
        marker = len(sent.ids)
        wait_for(
            "messages sent after the kill",
            lambda: {f"m{marker}", f"m{marker + 50}"} <= log.read_ids(),
            240,
        )
        recovered = time.monotonic() - killed
        print(f"cluster: a message sent after the worker died arrived {recovered:.1f} s later")
        # And the job itself is killed and started again (from its checkpoint)
        wait_for("two thirds through", lambda: len(log.read_ids()) > 2 * MESSAGES // 3, 240)
        assert ingest.pid is not None
        os.killpg(ingest.pid, signal.SIGKILL)  # the driver and its JVM, mid-batch
        ingest.stop()
        ingest = Child(ingest_spec(world, cluster, tmp_path))
        ingest.start()
        sent.done.wait(120)
        # Then every message is in the main log once, each group in the order it was sent,
        # and no message sent twice is there twice
        wait_for("everything", lambda: sent.ids | {"first"} <= log.read_ids(), 300)
    finally:
        ingest.stop()
    reads = first_reads(log)
    ids = [m for _, m in reads]
    assert len(ids) == len(set(ids)) == MESSAGES + 1
    by_group: dict[str, list[str]] = defaultdict(list)
    for group, message_id in reads:
        if message_id != "first":
            by_group[group].append(message_id)
    assert by_group == sent.groups
    print(f"cluster: {MESSAGES} messages ({sent.resent} sent twice), 1 worker and 1 job killed")
