"""A three-node Kafka cluster (cli/kafka_cluster.py) for tests: on free ports, its data and logs
in one folder, stopped afterwards."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from confluent_kafka.admin import AdminClient

from cli.jars import resolve_kafka_jars
from cli.kafka_cluster import LocalKafkaCluster
from setu.settings import Settings

START_TIMEOUT_S = 120.0


@contextmanager
def three_nodes(home: Path) -> Iterator[LocalKafkaCluster]:
    libs = resolve_kafka_jars(Settings())[0].parent
    running = LocalKafkaCluster.on_free_ports(home, libs, size=3)
    try:
        running.start(START_TIMEOUT_S)
        yield running
    finally:
        running.stop()


def partitions(bootstrap: str, topic: str) -> dict[int, tuple[int, list[int]]]:
    """Each partition's leader and in-sync replicas, as the brokers report them now."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    found = admin.list_topics(topic, timeout=10).topics[topic]
    return {p: (meta.leader, list(meta.isrs)) for p, meta in found.partitions.items()}
