"""A three-node Kafka cluster (cli/kafka_cluster.py) on real JVMs: a node loses its disk under a
steady stream of acknowledged writes and comes back, and nothing acknowledged is lost or out
of order; with two nodes stopped, no write is acknowledged at all."""

from __future__ import annotations

import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    ElectionType,
    KafkaError,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from cli.kafka_cluster import (
    LocalKafkaCluster,
    partitions_held_only_by,
    read_meta_properties,
)
from tests.kafka_cluster import partitions as partitions_of
from tests.kafka_cluster import three_nodes
from tests.waiting import wait_for

pytestmark = pytest.mark.integration

TOPIC = "numbers"
PARTITIONS = 3
MESSAGES = 2_000
# 2,000 messages at this pace take about 40 s: longer than a node takes to be killed, given an
# empty disk, restarted and made a voter again, so the stream runs through all of it.
PACE_S = 0.02
# A fenced broker is noticed after broker.session.timeout.ms (9 s), and catching up shares two
# cores with everything else.
REJOIN_TIMEOUT_S = 120.0
WIPED = 2
# What a producer is told when too few replicas would hold a write, or when none answers.
REFUSALS = {
    KafkaError.NOT_ENOUGH_REPLICAS,
    KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
    KafkaError.REQUEST_TIMED_OUT,
    KafkaError._MSG_TIMED_OUT,
    KafkaError._TIMED_OUT,
}


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalKafkaCluster]:
    with three_nodes(tmp_path / "kafka") as running:
        yield running


def create_topic(bootstrap: str) -> None:
    """Three partitions, three replicas, a write taken once two replicas hold it (what Setu
    sets on its topics with three replicas)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    topic = NewTopic(TOPIC, PARTITIONS, 3, config={"min.insync.replicas": "2"})
    admin.create_topics([topic])[TOPIC].result(30)


def safe_producer(bootstrap: str, **config: str | int) -> Producer:
    """A producer whose writes are acknowledged only once every in-sync replica holds them,
    and never repeated or reordered by its retries."""
    return Producer(
        {"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True, **config}
    )


@dataclass
class Acks:
    """What the producer was told: per partition, (offset, number) of every acknowledged
    message, in the order the acknowledgements came; and every error."""

    by_partition: defaultdict[int, list[tuple[int, int]]] = field(
        default_factory=lambda: defaultdict(list)
    )
    errors: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, error: KafkaError | None, message: Message) -> None:
        with self.lock:
            if error is not None:
                self.errors.append(str(error))
                return
            number = int(message.value() or b"")
            self.by_partition[message.partition() or 0].append((message.offset() or 0, number))

    def count(self) -> int:
        with self.lock:
            return sum(len(acked) for acked in self.by_partition.values())


def produce_numbers(bootstrap: str, acks: Acks, produced: list[int]) -> None:
    """Produces 0..MESSAGES-1 at a steady pace, number ``n`` to partition ``n % PARTITIONS``,
    then waits for every acknowledgement. ``produced`` holds how many were handed over."""
    producer = safe_producer(bootstrap)
    for number in range(MESSAGES):
        producer.produce(
            TOPIC, str(number).encode(), partition=number % PARTITIONS, on_delivery=acks.record
        )
        produced[0] = number + 1
        producer.poll(0)
        time.sleep(PACE_S)  # a steady stream, not a burst that ends before the crash
    producer.flush(REJOIN_TIMEOUT_S)


def partitions(bootstrap: str) -> dict[int, tuple[int, list[int]]]:
    return partitions_of(bootstrap, TOPIC)


def in_every_isr(bootstrap: str, node_id: int) -> bool:
    try:
        found = partitions(bootstrap)
    except Exception:  # metadata not answered yet
        return False
    return len(found) == PARTITIONS and all(node_id in isr for _, isr in found.values())


def led_by(bootstrap: str, alive: set[int]) -> bool:
    """Whether every partition has a leader among ``alive``."""
    try:
        found = partitions(bootstrap)
    except Exception:
        return False
    return len(found) == PARTITIONS and all(leader in alive for leader, _ in found.values())


def read_topic(bootstrap: str) -> dict[int, list[tuple[int, int]]]:
    """Every record of the topic from its beginning, per partition: (offset, number)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"verify-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
        }
    )
    found: dict[int, list[tuple[int, int]]] = defaultdict(list)
    try:
        ends = {
            p: consumer.get_watermark_offsets(TopicPartition(TOPIC, p), timeout=30)[1]
            for p in range(PARTITIONS)
        }
        consumer.assign([TopicPartition(TOPIC, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])

        def read_to_the_end() -> bool:
            for message in consumer.consume(500, timeout=1):
                assert message.error() is None, message.error()
                found[message.partition() or 0].append(
                    (message.offset() or 0, int(message.value() or b""))
                )
            return all(len(found[p]) >= ends[p] for p in range(PARTITIONS))

        wait_for("the whole topic read", read_to_the_end, timeout_s=60)
    finally:
        consumer.close()
    return found


def test_a_node_that_lost_its_disk_comes_back_and_no_acknowledged_write_is_lost(
    cluster: LocalKafkaCluster,
) -> None:
    bootstrap = cluster.bootstrap
    create_topic(bootstrap)
    old_directory = read_meta_properties(cluster.node(WIPED).data_dir)["directory.id"]
    acks, produced = Acks(), [0]
    producer = threading.Thread(target=produce_numbers, args=(bootstrap, acks, produced))
    producer.start()
    try:
        # Given a stream of acknowledged writes under way
        wait_for("writes acknowledged", lambda: acks.count() >= 300, timeout_s=60)
        # When a node crashes, loses its disk, and comes back with an empty one
        cluster.kill_node(WIPED)
        killed_at = produced[0]
        cluster.replace_disk(WIPED)
        cluster.start_node(WIPED)
        cluster.join_quorum(WIPED, REJOIN_TIMEOUT_S)
        wait_for(
            f"node {WIPED} back in the ISR of every partition",
            lambda: in_every_isr(bootstrap, WIPED),
            timeout_s=REJOIN_TIMEOUT_S,
        )
        back_at = produced[0]
    finally:
        producer.join()

    # Then it votes again, with its new disk
    new_directory = read_meta_properties(cluster.node(WIPED).data_dir)["directory.id"]
    assert new_directory != old_directory
    assert cluster.voters()[WIPED] == new_directory
    # And the stream ran on throughout, every write acknowledged
    assert back_at > killed_at, "no message was produced while the node was away"
    assert acks.errors == []
    assert acks.count() == MESSAGES

    # When the rejoined node leads the partition it prefers, and another node is killed, so
    # that the metadata quorum needs the rejoined node's vote and reads need its copies
    admin = AdminClient({"bootstrap.servers": bootstrap})
    every_partition = [TopicPartition(TOPIC, p) for p in range(PARTITIONS)]
    admin.elect_leaders(ElectionType.PREFERRED, every_partition).result(30)
    other = next(node.node_id for node in cluster.nodes if node.node_id != WIPED)
    cluster.kill_node(other)
    alive = {node.node_id for node in cluster.nodes} - {other}
    wait_for("every partition led by a live node", lambda: led_by(bootstrap, alive), 60)
    assert WIPED in {leader for leader, _ in partitions(bootstrap).values()}

    # Then every acknowledged write is there, once, in the order it was produced
    read = read_topic(bootstrap)
    for partition in range(PARTITIONS):
        acknowledged = sorted(acks.by_partition[partition])
        assert read[partition] == acknowledged, f"partition {partition} differs"
        numbers = [number for _, number in read[partition]]
        assert numbers == list(range(partition, MESSAGES, PARTITIONS))


def test_with_two_nodes_stopped_no_write_is_acknowledged(cluster: LocalKafkaCluster) -> None:
    bootstrap = cluster.bootstrap
    create_topic(bootstrap)
    # Setu's kind of producer, which retries until its message times out; and one that tries
    # once, to hear the broker's own answer
    safe = safe_producer(bootstrap, **{"message.timeout.ms": 15_000})
    once = Producer(
        {"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": False, "retries": 0}
    )
    outcomes: dict[str, list[KafkaError | None]] = {"safe": [], "once": []}

    def send(name: str, producer: Producer, partition: int) -> None:
        def record(error: KafkaError | None, message: Message) -> None:
            outcomes[name].append(error)

        producer.produce(TOPIC, name.encode(), partition=partition, on_delivery=record)

    # Given producers that have written to the cluster (they know its metadata; the safe one
    # holds its producer id)
    for name, producer in (("safe", safe), ("once", once)):
        send(name, producer, 0)
        assert producer.flush(30) == 0
    assert outcomes == {"safe": [None], "once": [None]}
    # When two of the three nodes are stopped, leaving node 1 the only replica in sync
    cluster.stop_node(2)
    cluster.stop_node(3)
    wait_for(
        "node 1 alone in every ISR",
        lambda: all(isr == [1] for _, isr in partitions(bootstrap).values()),
        timeout_s=30,
    )
    # Then every write to every partition is refused, or times out: none is acknowledged
    for partition in range(PARTITIONS):
        send("safe", safe, partition)
        send("once", once, partition)
    assert safe.flush(60) == 0 and once.flush(60) == 0
    for name in ("safe", "once"):
        refused = outcomes[name][1:]
        assert len(refused) == PARTITIONS, (name, refused)
        assert all(error is not None for error in refused), (name, refused)
        assert {error.code() for error in refused if error is not None} <= REFUSALS, refused
    # And the broker itself refuses: too few replicas in sync
    assert {e.code() for e in outcomes["once"][1:] if e} == {KafkaError.NOT_ENOUGH_REPLICAS}
    # And node 1, the only replica in sync, is one whose disk may not be replaced now
    only_node_1 = partitions_held_only_by(1, cluster.node(1).bootstrap)
    assert only_node_1 == [f"{TOPIC}-{p}" for p in range(PARTITIONS)]
    assert partitions_held_only_by(2, cluster.node(1).bootstrap) == []
