"""The long form's own Kafka (one broker, or a three-node cluster) and Redis, so the chaos loop
may kill them too.

They are started through ``cli``'s local-service modules (the ones ``setu dev up`` uses) on
free loopback ports, with their data inside the run's folder: Kafka keeps its log segments and
Redis its append-only file across every kill (a node of a cluster may also lose its disk:
``bench/crash/faults.py``). ``cli`` is imported only here, and only when a run asks for its own
brokers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.crash.chaos import ComponentSpec
from bench.crash.stack import BROKER_MIN_UPTIME_S, base_env


@dataclass(frozen=True)
class Brokers:
    """Specs of the services (Kafka's nodes ``kafka`` or ``kafka-1``…, ``redis``), their
    addresses, and a readiness probe for Kafka and one for Redis."""

    specs: list[ComponentSpec]
    kafka_bootstrap: str
    redis_url: str
    ready: dict[str, Callable[[], bool]]
    redis_data: Path  # Redis's data folder (bench/crash/faults.py rolls it back)
    cluster: Any = None  # the cli.kafka_cluster.LocalKafkaCluster of a three-node run


def prepare_brokers(workdir: Path, kafka_heap: str = "512m", kafka_nodes: int = 1) -> Brokers:
    """Fetch the broker's jars if needed, write configurations, format Kafka's storage."""
    from cli.jars import resolve_kafka_jars
    from cli.kafka_cluster import LocalKafkaCluster
    from cli.kafka_local import KafkaNode, LocalKafka
    from cli.ports import any_free_port
    from cli.probes import kafka_answers, redis_answers
    from cli.redis_local import LocalRedis, RedisNode
    from setu.settings import Settings

    ports: set[int] = set()

    def free_port() -> int:
        port = any_free_port()
        while port in ports:
            port = any_free_port()
        ports.add(port)
        return port

    logs = workdir / "logs"
    libs = resolve_kafka_jars(Settings())[0].parent
    cluster = None
    if kafka_nodes > 1:
        cluster = LocalKafkaCluster.on_free_ports(workdir / "kafka", libs, kafka_nodes, kafka_heap)
        cluster.prepare()
        kafka_children = [cluster.child_spec(n.node_id) for n in cluster.nodes]
        bootstrap = cluster.bootstrap
        kafka_ready = cluster.answers
    else:
        kafka_node = KafkaNode(free_port(), free_port(), workdir / "kafka" / "data")
        kafka = LocalKafka(workdir / "kafka", kafka_node, libs, logs / "kafka.log", kafka_heap)
        kafka.prepare()
        kafka_children = [kafka.child_spec()]
        bootstrap = kafka_node.bootstrap
        kafka_ready = lambda: kafka_answers(bootstrap)  # noqa: E731
    redis_node = RedisNode(free_port(), workdir / "redis" / "data")
    redis = LocalRedis(workdir / "redis", redis_node, logs / "redis.log")
    redis.prepare()

    specs = []
    for child in [*kafka_children, redis.child_spec()]:
        kind = "redis" if child.name == "redis" else "kafka"
        specs.append(
            ComponentSpec(
                name=child.name,
                argv=list(child.argv),
                env=dict(child.env) if child.env is not None else base_env(),
                cwd=child.cwd or workdir,
                log_path=child.log_path,
                min_uptime_s=BROKER_MIN_UPTIME_S[kind],
            )
        )
    return Brokers(
        specs=specs,
        kafka_bootstrap=bootstrap,
        redis_url=redis_node.url,
        ready={"kafka": kafka_ready, "redis": lambda: redis_answers(redis_node.url)},
        redis_data=redis_node.data_dir,
        cluster=cluster,
    )
