"""A real single-node Apache Kafka broker (KRaft, combined broker and controller) on loopback.

It runs from the jars in the cache dir (see :mod:`cli.jars`) with its configuration and data in
one folder; the storage is formatted once, so a second run keeps every topic and offset.

Given SCRAM users, its one client listener takes only clients that log in as one of them with
SCRAM-SHA-256 (the broker itself logs in as the first); the users are written into the storage
when it is formatted. Given TLS files, the listener speaks TLS. So the listener is PLAINTEXT,
SASL_PLAINTEXT, SSL or SASL_SSL (docs/security.md §8).

The same node description, given a :class:`Quorum`, renders one node of a cluster of such
nodes (see :mod:`cli.kafka_cluster`).
"""

from __future__ import annotations

import base64
import re
import shutil
import subprocess
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from pydantic import SecretStr

from cli.ports import LOOPBACK
from cli.processes import ChildSpec
from setu.kafka_security import SaslMechanism, SecurityProtocol, jaas_config

DEFAULT_PORT = 9092
DEFAULT_CONTROLLER_PORT = 9093
STOP_TIMEOUT_S = 40.0
SCRAM = SaslMechanism.SCRAM_SHA_256
# What --add-scram takes unquoted in a user's name or password.
_SCRAM_SAFE = re.compile(r"[A-Za-z0-9._~-]+")


class KafkaUnavailable(Exception):
    """Raised when the broker cannot be prepared (no java, storage formatting failed)."""


@dataclass(frozen=True)
class BrokerTls:
    """PEM files of a TLS listener: the broker's private key (PKCS#8) followed by its
    certificate chain, and the authorities it trusts (its own, to reach itself)."""

    keystore: Path
    truststore: Path


@dataclass(frozen=True)
class KafkaNode:
    """Where one local broker listens and keeps its log segments."""

    port: int
    controller_port: int
    data_dir: Path
    node_id: int = 1
    host: str = LOOPBACK
    # SCRAM-SHA-256 users (name, password); any: clients must log in as one (see module doc).
    scram_users: tuple[tuple[str, SecretStr], ...] = ()
    tls: BrokerTls | None = None

    def __post_init__(self) -> None:
        for name, password in self.scram_users:
            if not (
                _SCRAM_SAFE.fullmatch(name) and _SCRAM_SAFE.fullmatch(password.get_secret_value())
            ):
                raise ValueError(f"SCRAM user {name!r}: use letters, digits and ._~- only")

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def protocol(self) -> SecurityProtocol:
        """What the client listener speaks."""
        if self.scram_users:
            return SecurityProtocol.SASL_SSL if self.tls else SecurityProtocol.SASL_PLAINTEXT
        return SecurityProtocol.SSL if self.tls else SecurityProtocol.PLAINTEXT


def tls_properties(node: KafkaNode) -> dict[str, str]:
    """The TLS files of the client listener, PEM as they are (empty without TLS)."""
    if node.tls is None:
        return {}
    return {
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(node.tls.keystore),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(node.tls.truststore),
    }


def sasl_properties(node: KafkaNode) -> dict[str, str]:
    """The settings of a SASL client listener taking SCRAM-SHA-256 logins, the broker logging
    in to it as the first user (empty without users)."""
    if not node.scram_users:
        return {}
    name, password = node.scram_users[0]
    listener = node.protocol.lower()
    return {
        "sasl.enabled.mechanisms": str(SCRAM),
        "sasl.mechanism.inter.broker.protocol": str(SCRAM),
        # Names and passwords are plain (letters, digits, ._~-): no escaping in either file.
        f"listener.name.{listener}.{SCRAM.lower()}.sasl.jaas.config": jaas_config(
            SCRAM, name, password
        ),
    }


@dataclass(frozen=True)
class Quorum:
    """The voters of a cluster of combined nodes: every node, by node id and controller port.

    They form a KIP-853 dynamic quorum: nodes find it through
    ``controller.quorum.bootstrap.servers``, and a voter is a node id *and* the directory id of
    its metadata log, so a node that lost its disk does not vote until it is added again.
    """

    controllers: tuple[tuple[int, int], ...]  # (node id, controller port)
    host: str = LOOPBACK

    @property
    def bootstrap_servers(self) -> str:
        """Every controller's address, comma-separated."""
        return ",".join(f"{self.host}:{port}" for _, port in self.controllers)

    @property
    def replication_factor(self) -> int:
        """Replicas of each partition: three, or every node of a smaller cluster."""
        return min(3, len(self.controllers))

    def initial_controllers(self, directory_ids: Mapping[int, str]) -> str:
        """The ``--initial-controllers`` value that formats every node of a new cluster:
        ``id@host:port:directory`` for each voter, the same on every node."""
        return ",".join(
            f"{node_id}@{self.host}:{port}:{directory_ids[node_id]}"
            for node_id, port in self.controllers
        )


def min_insync_replicas(replication_factor: int) -> int:
    """Two replicas must hold a write once there are three (one may fail without losing an
    acknowledged write, as state/kafka_admin.py sets on Setu's topics); else one."""
    return 2 if replication_factor >= 3 else 1


def replication_properties(replication_factor: int) -> dict[str, str]:
    """Replication of Kafka's internal topics (offsets, transactions, share-group state) and of
    topics created without their own settings."""
    factor, min_isr = str(replication_factor), str(min_insync_replicas(replication_factor))
    return {
        "default.replication.factor": factor,
        "min.insync.replicas": min_isr,
        "offsets.topic.replication.factor": factor,
        "transaction.state.log.replication.factor": factor,
        "transaction.state.log.min.isr": min_isr,
        "share.coordinator.state.topic.replication.factor": factor,
        "share.coordinator.state.topic.min.isr": min_isr,
    }


def quorum_properties(node: KafkaNode, quorum: Quorum | None) -> dict[str, str]:
    """Where the node finds its controllers, and what it advertises.

    Alone, it is the one static voter. In a quorum, it also advertises its controller listener:
    that address is what a voter is added with, and what the other voters reach it at.
    """
    client = f"{node.protocol}://{node.host}:{node.port}"
    if quorum is None:
        return {
            "controller.quorum.voters": f"{node.node_id}@{node.host}:{node.controller_port}",
            "advertised.listeners": client,
        }
    return {
        "controller.quorum.bootstrap.servers": quorum.bootstrap_servers,
        "advertised.listeners": f"{client},CONTROLLER://{node.host}:{node.controller_port}",
    }


def render_server_properties(node: KafkaNode, quorum: Quorum | None = None) -> str:
    """server.properties for a combined broker+controller that only a local machine uses.

    Topics are never created implicitly (Setu creates every topic with its partition count).
    Alone, the node is its own controller and internal topics have one replica. In a
    ``quorum`` of such nodes, internal topics get the quorum's replication factor (three) and
    take a write once two replicas hold it, like Setu's own topics.
    """
    client = node.protocol
    replication = 1 if quorum is None else quorum.replication_factor
    settings = {
        "process.roles": "broker,controller",
        "node.id": str(node.node_id),
        "listeners": f"{client}://{node.host}:{node.port},CONTROLLER://{node.host}:"
        f"{node.controller_port}",
        **quorum_properties(node, quorum),
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": str(client),
        "listener.security.protocol.map": f"{client}:{client},CONTROLLER:PLAINTEXT",
        **sasl_properties(node),
        **tls_properties(node),
        "log.dirs": str(node.data_dir),
        "auto.create.topics.enable": "false",
        "num.partitions": "1",
        "offsets.topic.num.partitions": "10",
        **replication_properties(replication),
        "group.initial.rebalance.delay.ms": "0",
    }
    return "".join(f"{key}={value}\n" for key, value in settings.items())


def render_log4j2() -> str:
    """log4j2 configuration: everything to stdout, which the broker's log file captures."""
    return """\
status = warn
appender.out.type = Console
appender.out.name = out
appender.out.target = SYSTEM_OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = out
logger.request.name = kafka.request.logger
logger.request.level = WARN
logger.state.name = state.change.logger
logger.state.level = WARN
"""


def new_cluster_id() -> str:
    """A Kafka cluster id: 16 random bytes, URL-safe base64 without padding (22 chars), not
    starting with ``-`` (as Kafka's own ``random-uuid``): the storage tool read such an id as
    an option and refused to format, so one ``dev up`` in 64 failed on a fresh data folder."""
    while True:
        found = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not found.startswith("-"):
            return found


def classpath(libs: Path) -> str:
    return f"{libs}/*"


def format_command(
    java: str,
    libs: Path,
    log4j: Path,
    cluster_id: str,
    properties: Path,
    scram_users: tuple[tuple[str, SecretStr], ...] = (),
    *,
    quorum_options: Sequence[str] = (),
) -> list[str]:
    """Formats the KRaft storage named in ``properties`` (once per data dir), with the SCRAM
    users in it. Their passwords are on this short command's line: a loopback broker's only.

    ``quorum_options`` say how a node of a dynamic quorum starts: ``--initial-controllers``
    for a new cluster, ``--no-initial-controllers`` for a node joining an existing one.
    """
    users = [
        f"--add-scram={SCRAM}=[name={name},password={password.get_secret_value()}]"
        for name, password in scram_users
    ]
    return [
        java,
        f"-Dlog4j2.configurationFile={log4j}",
        "-cp",
        classpath(libs),
        "kafka.tools.StorageTool",
        "format",
        "--cluster-id",
        cluster_id,
        "--config",
        str(properties),
        *quorum_options,
        *users,
    ]


def broker_command(java: str, libs: Path, heap: str, log4j: Path, properties: Path) -> list[str]:
    """Runs the broker in the foreground with a modest heap."""
    return [
        java,
        f"-Xmx{heap}",
        "-XX:+UseG1GC",
        "-XX:MaxGCPauseMillis=20",
        "-XX:+ExitOnOutOfMemoryError",
        "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={log4j}",
        "-cp",
        classpath(libs),
        "kafka.Kafka",
        str(properties),
    ]


class LocalKafka:
    """A broker whose configuration and data live in ``home``."""

    def __init__(self, home: Path, node: KafkaNode, libs: Path, log_path: Path, heap: str):
        self.home = home
        self.node = node
        self.libs = libs
        self.log_path = log_path
        self.heap = heap
        self.properties = home / "server.properties"
        self.log4j = home / "log4j2.properties"

    def prepare(self) -> None:
        """Writes the configuration and formats the storage if it never was.

        Raises KafkaUnavailable when java is missing or formatting fails.
        """
        self.home.mkdir(parents=True, exist_ok=True)
        self.properties.write_text(render_server_properties(self.node))
        self.log4j.write_text(render_log4j2())
        if (self.node.data_dir / "meta.properties").is_file():
            return
        result = subprocess.run(
            format_command(
                self._java(),
                self.libs,
                self.log4j,
                new_cluster_id(),
                self.properties,
                self.node.scram_users,
            ),
            capture_output=True,
            text=True,
            check=False,
            stdin=subprocess.DEVNULL,
        )
        if result.returncode != 0:
            raise KafkaUnavailable(
                f"formatting Kafka storage in {self.node.data_dir} failed:\n"
                f"{result.stdout}{result.stderr}"
            )

    def child_spec(self) -> ChildSpec:
        return ChildSpec(
            name="kafka",
            argv=tuple(
                broker_command(self._java(), self.libs, self.heap, self.log4j, self.properties)
            ),
            log_path=self.log_path,
            cwd=self.home,
            stop_timeout_s=STOP_TIMEOUT_S,
        )

    def _java(self) -> str:
        return find_java()


def find_java() -> str:
    """The java that runs the broker and Kafka's tools. Raises KafkaUnavailable without one."""
    java = shutil.which("java")
    if java is None:
        raise KafkaUnavailable("java is not installed: run scripts/install")
    return java
