"""The long form's own Kafka (one broker, or a three-node cluster) and Redis (one server, or
with Sentinel a primary and a replica), so the chaos loop may kill them too.

They are started through ``cli``'s local-service modules (the ones ``setu dev up`` uses) on
free loopback ports, with their data inside the run's folder: Kafka keeps its log segments and
Redis its append-only file across every kill (a node of a cluster may also lose its disk:
``bench/crash/faults.py``). ``cli`` is imported only here, and only when a run asks for its own
brokers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import redis

from bench.crash.chaos import ComponentSpec
from bench.crash.stack import BROKER_MIN_UPTIME_S, base_env

SENTINEL_MASTER = "setu"
# Sentinel calls a primary down after this long without an answer, then promotes the replica.
SENTINEL_DOWN_AFTER_MS = 1_000


@dataclass(frozen=True)
class RedisNodes:
    """The run's Redis servers by component name (``redis``; with Sentinel also
    ``redis-replica``), and the Sentinel's address when there is one. Which server is the
    primary changes with each failover: :meth:`primary` asks Sentinel."""

    urls: dict[str, str]
    data: dict[str, Path]  # each server's data folder (bench/crash/faults.py rolls it back)
    sentinel: str | None = None  # "host:port"

    def primary(self) -> str:
        """The component name of the current primary (raises redis.RedisError if Sentinel
        does not answer)."""
        if self.sentinel is None:
            return "redis"
        host, _, port = self.sentinel.rpartition(":")
        client = redis.Redis(host=host, port=int(port), socket_timeout=2)
        try:
            _, primary_port = client.sentinel_get_master_addr_by_name(SENTINEL_MASTER)  # type: ignore[no-untyped-call]
        finally:
            client.close()
        return next(n for n, url in self.urls.items() if url.endswith(f":{primary_port}/0"))

    def primary_url(self) -> str:
        return self.urls[self.primary()]

    def setu_env(self) -> dict[str, str]:
        """What Setu's processes need to find the primary through Sentinel."""
        if self.sentinel is None:
            return {}
        return {
            "SETU_REDIS_SENTINELS": self.sentinel,
            "SETU_REDIS_SENTINEL_MASTER": SENTINEL_MASTER,
        }


@dataclass(frozen=True)
class Brokers:
    """Specs of the services (Kafka's nodes ``kafka`` or ``kafka-1``…, ``redis`` and with
    Sentinel ``redis-replica`` and ``sentinel``), their addresses, and a readiness probe for
    Kafka and one for Redis."""

    specs: list[ComponentSpec]
    kafka_bootstrap: str
    redis_url: str
    ready: dict[str, Callable[[], bool]]
    redis: RedisNodes
    cluster: Any = None  # the cli.kafka_cluster.LocalKafkaCluster of a three-node run


def prepare_brokers(
    workdir: Path, kafka_heap: str = "512m", kafka_nodes: int = 1, sentinel: bool = False
) -> Brokers:
    """Fetch the broker's jars if needed, write configurations, format Kafka's storage.
    ``sentinel``: Redis as a primary and a replica watched by one Sentinel (quorum 1)."""
    from cli.jars import resolve_kafka_jars
    from cli.kafka_cluster import LocalKafkaCluster
    from cli.kafka_local import KafkaNode, LocalKafka
    from cli.ports import any_free_port
    from cli.probes import kafka_answers, redis_answers
    from cli.processes import ChildSpec
    from cli.redis_local import LocalRedis, RedisNode, SentinelNode, render_sentinel_conf
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
    nodes = {"redis": redis_node}
    if sentinel:
        primary = (redis_node.host, redis_node.port)
        nodes["redis-replica"] = RedisNode(
            free_port(), workdir / "redis-replica" / "data", replica_of=primary
        )
    redis_children = []
    for name, node in nodes.items():
        server = LocalRedis(node.data_dir.parent, node, logs / f"{name}.log")
        server.prepare()
        child = server.child_spec()
        redis_children.append(replace(child, name=name))
    sentinel_address = None
    if sentinel:
        home = workdir / "sentinel"
        home.mkdir(parents=True, exist_ok=True)
        watch = SentinelNode(
            free_port(),
            home,
            SENTINEL_MASTER,
            (redis_node.host, redis_node.port),
            quorum=1,
            down_after_ms=SENTINEL_DOWN_AFTER_MS,
        )
        (home / "sentinel.conf").write_text(render_sentinel_conf(watch))
        binary = redis_children[0].argv[0]  # redis-server, as a Sentinel
        argv = (binary, str(home / "sentinel.conf"), "--sentinel")
        redis_children.append(ChildSpec("sentinel", argv, logs / "sentinel.log", cwd=home))
        sentinel_address = f"{watch.host}:{watch.port}"
    redis_nodes = RedisNodes(
        urls={name: node.url for name, node in nodes.items()},
        data={name: node.data_dir for name, node in nodes.items()},
        sentinel=sentinel_address,
    )

    specs = []
    for child in [*kafka_children, *redis_children]:
        kind = "kafka" if child.name.startswith("kafka") else "redis"
        specs.append(
            ComponentSpec(
                name=child.name,
                argv=list(child.argv),
                env=dict(child.env) if child.env is not None else base_env(),
                cwd=child.cwd or workdir,
                log_path=child.log_path,
                # One Sentinel: it watches, and a failover needs it (never killed)
                chaos=child.name != "sentinel",
                min_uptime_s=BROKER_MIN_UPTIME_S[kind],
                # The cluster's nodes: one down at a time, as replication promises to survive.
                domain="kafka" if cluster is not None and kind == "kafka" else None,
            )
        )

    def redis_ready() -> bool:
        if not all(redis_answers(url) for url in redis_nodes.urls.values()):
            return False
        return sentinel_address is None or _replica_known(sentinel_address)

    return Brokers(
        specs=specs,
        kafka_bootstrap=bootstrap,
        redis_url=redis_node.url,
        ready={"kafka": kafka_ready, "redis": redis_ready},
        redis=redis_nodes,
        cluster=cluster,
    )


def _replica_known(sentinel: str) -> bool:
    """Whether the Sentinel has found the primary's replica (it can fail over to it)."""
    host, _, port = sentinel.rpartition(":")
    client = redis.Redis(host=host, port=int(port), socket_timeout=1)
    try:
        return bool(client.sentinel_slaves(SENTINEL_MASTER))  # type: ignore[no-untyped-call]
    except redis.RedisError:
        return False
    finally:
        client.close()
