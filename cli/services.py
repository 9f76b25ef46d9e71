"""Starting the local dependencies — Kafka, Redis, PostgreSQL — on a :class:`Stack`.

Shared by ``setu dev up`` (Kafka and Redis that keep their data) and ``setu services`` (all
three, throwaway, for the test suite).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cli import kafka_local, redis_local
from cli.jars import resolve_kafka_jars
from cli.kafka_local import KafkaNode, KafkaUnavailable, LocalKafka
from cli.maven import FetchFailed
from cli.ports import PortBusy, pick
from cli.postgres_local import LocalPostgres, PostgresNode, PostgresUnavailable
from cli.probes import NotReady, kafka_answers, redis_answers
from cli.redis_local import LocalRedis, RedisNode, RedisUnavailable
from cli.stack import Stack
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
) -> str:
    """Starts a broker keeping its data in ``home``; returns its bootstrap address."""
    libs = resolve_kafka_jars(settings)[0].parent
    node = KafkaNode(
        port=ports.take("kafka"),
        controller_port=ports.take("kafka_controller"),
        data_dir=home / "data",
    )
    broker = LocalKafka(home, node, libs, log_path, heap)
    broker.prepare()
    stack.start(broker.child_spec(), lambda: kafka_answers(node.bootstrap), timeout_s)
    return node.bootstrap


def start_redis(stack: Stack, home: Path, log_path: Path, ports: PortPlan, timeout_s: float) -> str:
    """Starts Redis keeping its data (AOF) in ``home``; returns its URL."""
    node = RedisNode(port=ports.take("redis"), data_dir=home / "data")
    server = LocalRedis(home, node, log_path)
    server.prepare()
    stack.start(server.child_spec(), lambda: redis_answers(node.url), timeout_s)
    return node.url


def start_postgres(
    stack: Stack, home: Path, log_path: Path, ports: PortPlan, timeout_s: float
) -> str:
    """Starts a throwaway PostgreSQL with its cluster in ``home``; returns its URL."""
    node = PostgresNode(port=ports.take("postgres"), home=home)
    server = LocalPostgres(node, log_path)
    server.prepare()
    stack.start(server.child_spec(), server.answers, timeout_s)
    return node.url


DEFAULT_PORTS = {
    "kafka": kafka_local.DEFAULT_PORT,
    "kafka_controller": kafka_local.DEFAULT_CONTROLLER_PORT,
    "redis": redis_local.DEFAULT_PORT,
}
