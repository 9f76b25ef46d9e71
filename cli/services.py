"""Starting the local dependencies — Kafka, Redis, PostgreSQL — on a :class:`Stack`.

Shared by ``setu dev up`` (Kafka and Redis that keep their data) and ``setu services`` (all
three, throwaway, for the test suite).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from pathlib import Path

from pydantic import SecretStr

from cli import kafka_local, redis_local
from cli.jars import resolve_kafka_jars
from cli.kafka_cluster import LocalKafkaCluster, NodePorts, moved_controllers
from cli.kafka_local import KafkaNode, KafkaUnavailable, LocalKafka
from cli.maven import FetchFailed
from cli.ports import LOOPBACK, PortBusy, pick
from cli.postgres_local import LocalPostgres, PostgresNode, PostgresUnavailable
from cli.probes import NotReady, kafka_answers, redis_answers, wait_until
from cli.processes import Child
from cli.redis_local import LocalRedis, RedisNode, RedisUnavailable
from cli.stack import Stack, death_reason
from setu.settings import Settings

# What can go wrong while starting services, each with a message that says what to do.
SETUP_ERRORS = (
    FetchFailed,
    KafkaUnavailable,
    RedisUnavailable,
    PostgresUnavailable,
    PortBusy,
    NotReady,
)


@dataclass
class PortPlan:
    """Ports asked for (explicit), used last time (remembered), and given out so far."""

    explicit: dict[str, int]
    remembered: dict[str, int]
    defaults: dict[str, int]
    chosen: dict[str, int]

    def take(self, name: str) -> int:
        """A free port for ``name``, distinct from every port already taken."""
        port = pick(
            self.explicit.get(name),
            self.remembered.get(name),
            self.defaults.get(name),
            set(self.chosen.values()),
        )
        self.chosen[name] = port
        return port


def start_kafka(
    stack: Stack,
    settings: Settings,
    home: Path,
    log_path: Path,
    ports: PortPlan,
    heap: str,
    timeout_s: float,
    host: str = LOOPBACK,
) -> str:
    """Starts a broker keeping its data in ``home``, listening on ``host``; returns its
    bootstrap address."""
    libs = resolve_kafka_jars(settings)[0].parent
    node = KafkaNode(
        port=ports.take("kafka"),
        controller_port=ports.take("kafka_controller"),
        data_dir=home / "data",
        host=host,
    )
    broker = LocalKafka(home, node, libs, log_path, heap)
    broker.prepare()
    stack.start(broker.child_spec(), lambda: kafka_answers(node.bootstrap), timeout_s)
    return node.bootstrap


def cluster_port_names(node_id: int) -> tuple[str, str]:
    """The names a cluster node's client and controller ports are remembered under. Node 1's
    are the single broker's, so ``SETU_DEV_KAFKA_PORT`` and ``SETU_DEV_KAFKA_CONTROLLER_PORT``
    apply to it."""
    if node_id == 1:
        return "kafka", "kafka_controller"
    return f"kafka_{node_id}", f"kafka_controller_{node_id}"


def cluster_default_ports(size: int) -> dict[str, int]:
    """The usual ports of a cluster's nodes: node 1 has the single broker's (9092, 9093), each
    further node the pair after the previous one's (9094 and 9095, then 9096 and 9097)."""
    defaults = {}
    for node_id in range(1, size + 1):
        client, controller = cluster_port_names(node_id)
        defaults[client] = kafka_local.DEFAULT_PORT + 2 * (node_id - 1)
        defaults[controller] = kafka_local.DEFAULT_CONTROLLER_PORT + 2 * (node_id - 1)
    return defaults


def start_kafka_cluster(
    stack: Stack,
    settings: Settings,
    home: Path,
    logs: Path,
    ports: PortPlan,
    heap: str,
    timeout_s: float,
    size: int,
) -> LocalKafkaCluster:
    """Starts a cluster of ``size`` nodes keeping their data in ``home``, each logging to
    ``logs/kafka-{id}.log``; returns it once every broker answers.

    The nodes are supervised, and stopped together. Raises PortBusy when more than one
    controller port of an existing cluster would change (its quorum could not form),
    KafkaUnavailable when a node of it lost its storage (cli/kafka_cluster.py), and what
    starting and waiting raise (SETUP_ERRORS).
    """
    libs = resolve_kafka_jars(settings)[0].parent
    node_ports = [
        NodePorts(ports.take(client), ports.take(controller))
        for client, controller in map(cluster_port_names, range(1, size + 1))
    ]
    cluster = LocalKafkaCluster(home, node_ports, libs, logs, heap)
    refuse_moved_controllers(cluster, ports.remembered)
    cluster.prepare()
    children = stack.start_together([cluster.child_spec(node.node_id) for node in cluster.nodes])
    wait_until(
        cluster.answers, "kafka cluster", timeout_s, stack.stop, died=lambda: first_death(children)
    )
    return cluster


def refuse_moved_controllers(cluster: LocalKafkaCluster, remembered: dict[str, int]) -> None:
    """Raises PortBusy when more than one node of an existing cluster would listen for its
    quorum elsewhere than last time: the voters would not find one another."""
    if not cluster.formatted():
        return
    before = {
        node_id: remembered[name]
        for node_id in (node.node_id for node in cluster.nodes)
        if (name := cluster_port_names(node_id)[1]) in remembered
    }
    now = {node.node_id: node.controller_port for node in cluster.nodes}
    moved = moved_controllers(now, before)
    if len(moved) > 1:
        raise PortBusy(
            f"the controller ports of Kafka nodes {moved} ({[before[n] for n in moved]}) are "
            "taken; the quorum can follow one node to another port per start, not more (it "
            "records where each voter listens): free them, or remove "
            f"{cluster.home} to start an empty cluster"
        )


def first_death(children: list[Child]) -> str | None:
    """Why the first of ``children`` that exited will not answer; None while all run."""
    return next((reason for child in children if (reason := death_reason(child))), None)


def start_redis(
    stack: Stack,
    home: Path,
    log_path: Path,
    ports: PortPlan,
    timeout_s: float,
    host: str = LOOPBACK,
) -> str:
    """Starts Redis keeping its data (AOF) in ``home``, listening on ``host``; returns its URL."""
    node = RedisNode(
        port=ports.take("redis"), data_dir=home / "data", host=host, password=_password_off(host)
    )
    server = LocalRedis(home, node, log_path)
    server.prepare()
    stack.start(server.child_spec(), lambda: redis_answers(node.url), timeout_s)
    return node.url


def start_postgres(
    stack: Stack,
    home: Path,
    log_path: Path,
    ports: PortPlan,
    timeout_s: float,
    host: str = LOOPBACK,
) -> str:
    """Starts a throwaway PostgreSQL with its cluster in ``home``, listening on ``host``;
    returns its URL."""
    node = PostgresNode(
        port=ports.take("postgres"), home=home, host=host, password=_password_off(host)
    )
    server = LocalPostgres(node, log_path)
    server.prepare()
    stack.start(server.child_spec(), server.answers, timeout_s)
    return node.url


def _password_off(host: str) -> SecretStr | None:
    """A new password for a server listening off loopback (reachable from other machines and
    containers); None on loopback."""
    return None if host == LOOPBACK else SecretStr(secrets.token_urlsafe(18))


DEFAULT_PORTS = {
    "kafka": kafka_local.DEFAULT_PORT,
    "kafka_controller": kafka_local.DEFAULT_CONTROLLER_PORT,
    "redis": redis_local.DEFAULT_PORT,
}
