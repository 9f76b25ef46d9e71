"""A local Apache Kafka cluster: N combined broker+controller nodes (KRaft), each its own JVM
with its own folder and ports, and every node a voter of the cluster's metadata quorum.

``setu dev up --brokers 3`` runs one under the data dir, its nodes supervised like every other
child; the integration tests (and the crash test) run one on free ports with
:meth:`LocalKafkaCluster.start` and kill, wipe and bring back single nodes.

**Why a dynamic quorum.** The nodes form a KIP-853 quorum (``--initial-controllers``,
``controller.quorum.bootstrap.servers``), not a static one (``controller.quorum.voters``). In a
dynamic quorum a voter is a node id *and* the directory id of its metadata log. A node whose
disk was wiped is formatted again with the cluster's id and its own node id but
``--no-initial-controllers``: it gets a new directory id, follows the metadata log as an
observer, and votes only after the voter it replaces (same node id, old directory id) is
removed and it is added (``kafka-metadata-quorum remove-controller`` / ``add-controller``,
which the leader accepts once the node has caught up): :meth:`LocalKafkaCluster.join_quorum`.
A re-formatted static voter would instead vote at once, with an empty log and no memory of the
votes it cast, which Kafka's own procedure for a replaced controller disk makes safe only by
an operator first checking that the other voters hold every committed record. So combined
nodes are enough: no dedicated controllers are needed for a node to lose its disk and return.

**An empty disk joins a running cluster only.** A broker's partitions are just as exposed: when
a partition's in-sync replicas all leave, Kafka 4.1 makes the last of them leader again when
it returns (its last known eligible replica), even with an empty disk, and the others truncate
to it. A cluster stopped whole and restarted with one node's folder wiped lost every record
that way. So :meth:`LocalKafkaCluster.prepare` refuses a node without storage, and
:meth:`LocalKafkaCluster.replace_disk` formats one only while the other nodes hold every
partition it has a replica of in sync, so that Kafka never elects it over them.

**Ports.** The quorum's log records where each voter listens. A voter that restarts on another
controller port still reaches the others at their recorded addresses and updates its own, so
one node may move per start; when several move at once, none reaches the others and the
cluster never forms (:func:`moved_controllers` lets callers refuse that up front). Client ports
are re-registered at every start and may all change.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cli.kafka_local import (
    STOP_TIMEOUT_S,
    KafkaNode,
    KafkaUnavailable,
    Quorum,
    broker_command,
    classpath,
    find_java,
    format_command,
    new_cluster_id,
    render_log4j2,
    render_server_properties,
)
from cli.ports import LOOPBACK, free_ports
from cli.probes import tcp_open
from cli.processes import Child, ChildSpec, stop_together

QUORUM_TOOL = "org.apache.kafka.tools.MetadataQuorumCommand"
# One tool run is a JVM start and a request or two; two busy cores can make that slow.
TOOL_TIMEOUT_S = 90.0
RETRY_PAUSE_S = 1.0
POLL_S = 0.25
# How a node formatted to join an existing cluster starts: following the quorum, not voting.
JOIN_EXISTING = ("--no-initial-controllers",)


@dataclass(frozen=True)
class NodePorts:
    """Where one node listens: for clients (and the other brokers), and for the quorum."""

    client: int
    controller: int


def read_meta_properties(data_dir: Path) -> dict[str, str]:
    """The identity Kafka wrote into ``data_dir`` when formatting it (``cluster.id``,
    ``node.id``, ``directory.id``); empty when it is not formatted."""
    try:
        text = (data_dir / "meta.properties").read_text()
    except FileNotFoundError:
        return {}
    pairs = (line.split("=", 1) for line in text.splitlines() if "=" in line)
    return {key.strip(): value.strip() for key, value in pairs if not key.startswith("#")}


def parse_voters(status: str) -> dict[int, str]:
    """The voters in the output of ``kafka-metadata-quorum describe --status``: node id →
    directory id of the metadata log it votes with. Raises KafkaUnavailable without them."""
    for line in status.splitlines():
        name, _, value = line.partition(":")
        if name.strip() == "CurrentVoters":
            return {int(voter["id"]): str(voter["directoryId"]) for voter in json.loads(value)}
    raise KafkaUnavailable(f"no voters in the quorum's description:\n{status}")


def moved_controllers(controllers: Mapping[int, int], remembered: Mapping[int, int]) -> list[int]:
    """Nodes whose controller port (node id → port) differs from the one remembered from the
    last start; nodes with nothing remembered have not moved."""
    return [
        node_id for node_id, port in controllers.items() if remembered.get(node_id, port) != port
    ]


def render_tools_log4j2() -> str:
    """log4j2 for Kafka's command-line tools: warnings only, on stderr, so that stdout holds
    nothing but the answer."""
    return """\
status = warn
appender.err.type = Console
appender.err.name = err
appender.err.target = SYSTEM_ERR
appender.err.layout.type = PatternLayout
appender.err.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.err.ref = err
"""


def quorum_command(
    java: str, libs: Path, log4j: Path, controllers: str, *arguments: str
) -> list[str]:
    """``kafka-metadata-quorum`` asking the controllers at ``controllers`` (host:port,...)."""
    return [
        java,
        f"-Dlog4j2.configurationFile={log4j}",
        "-cp",
        classpath(libs),
        QUORUM_TOOL,
        "--bootstrap-controller",
        controllers,
        *arguments,
    ]


def registered_brokers(bootstrap: str) -> set[int]:
    """Ids of the brokers a client of ``bootstrap`` is told about (registered and unfenced);
    empty until every address there accepts connections."""
    from confluent_kafka.admin import AdminClient

    addresses = [address.rpartition(":") for address in bootstrap.split(",")]
    # librdkafka logs every refused connection to stderr: ask once all are open.
    if not all(tcp_open(host, int(port)) for host, _, port in addresses):
        return set()
    admin = AdminClient({"bootstrap.servers": bootstrap})
    try:
        return set(admin.list_topics(timeout=3).brokers)
    except Exception:  # KafkaException of any kind means "not yet"
        return set()
    finally:
        del admin


def _partitions(bootstrap: str, who: str = "the Kafka nodes") -> list[tuple[str, Any]]:
    """Every partition as ``(topic-n, its metadata)``, in order, as the brokers at
    ``bootstrap`` report it now; raises KafkaUnavailable when none answers."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    try:
        topics = admin.list_topics(timeout=30).topics
    except Exception as error:  # KafkaException of any kind: nobody answered
        raise KafkaUnavailable(f"{who} do not answer: {error}") from error
    finally:
        del admin
    return [
        (f"{name}-{number}", partition)
        for name, topic in sorted(topics.items())
        for number, partition in sorted(topic.partitions.items())
    ]


def partitions_held_only_by(node_id: int, bootstrap: str) -> list[str]:
    """Partitions (``topic-n``) with replicas on other nodes too, none of which is in sync:
    the node is the only replica Kafka would elect. Raises KafkaUnavailable when the brokers
    at ``bootstrap`` do not answer."""
    return [
        name
        for name, partition in _partitions(bootstrap, "the other Kafka nodes")
        if node_id in partition.replicas
        and len(partition.replicas) > 1
        and not set(partition.isrs) - {node_id}
    ]


def partitions_lagging(bootstrap: str) -> list[str]:
    """Partitions (``topic-n``) with a replica out of sync: a node is still catching up, so
    losing another node's disk now could leave a single copy, or none. Raises
    KafkaUnavailable when the brokers at ``bootstrap`` do not answer."""
    return [
        name
        for name, partition in _partitions(bootstrap)
        if set(partition.replicas) - set(partition.isrs)
    ]


class LocalKafkaCluster:
    """Nodes 1..N of one cluster: node ``i`` keeps its configuration and data in
    ``home/node-i`` and writes its output to ``logs/kafka-i.log``.

    Two ways to run it. ``setu dev up`` calls :meth:`prepare`, starts :meth:`child_spec` of every
    node on its stack and waits for :meth:`answers`. Tests call :meth:`start` and :meth:`stop`,
    and act on one node with :meth:`stop_node`, :meth:`kill_node`, :meth:`replace_disk`,
    :meth:`start_node` and :meth:`join_quorum`.
    """

    def __init__(
        self,
        home: Path,
        ports: Sequence[NodePorts],
        libs: Path,
        logs: Path,
        heap: str = "512m",
        host: str = LOOPBACK,
    ) -> None:
        if not ports:
            raise ValueError("a cluster needs at least one node")
        self.home = home
        self.libs = libs
        self.logs = logs
        self.heap = heap
        self.nodes = tuple(
            KafkaNode(
                port=node.client,
                controller_port=node.controller,
                data_dir=home / f"node-{node_id}" / "data",
                node_id=node_id,
                host=host,
            )
            for node_id, node in enumerate(ports, start=1)
        )
        self.quorum = Quorum(tuple((n.node_id, n.controller_port) for n in self.nodes), host)
        self.log4j = home / "log4j2.properties"
        self.tools_log4j = home / "tools-log4j2.properties"
        self._children: dict[int, Child] = {}

    @classmethod
    def on_free_ports(
        cls, home: Path, libs: Path, size: int = 3, heap: str = "512m"
    ) -> LocalKafkaCluster:
        """A cluster of ``size`` nodes on ports free right now, logging to ``home/logs``."""
        found = free_ports(2 * size)
        ports = [NodePorts(found[2 * i], found[2 * i + 1]) for i in range(size)]
        return cls(home, ports, libs, home / "logs", heap)

    @property
    def bootstrap(self) -> str:
        """Every broker's client address, comma-separated."""
        return ",".join(node.bootstrap for node in self.nodes)

    @property
    def replication_factor(self) -> int:
        """Replicas of each partition, for Setu's topics as for Kafka's internal ones."""
        return self.quorum.replication_factor

    def node(self, node_id: int) -> KafkaNode:
        return self.nodes[node_id - 1]

    def properties(self, node_id: int) -> Path:
        return self.home / f"node-{node_id}" / "server.properties"

    def log_path(self, node_id: int) -> Path:
        return self.logs / f"kafka-{node_id}.log"

    # Storage.

    def formatted(self) -> bool:
        """Whether any node's storage is formatted, that is, the cluster exists."""
        return any(read_meta_properties(node.data_dir) for node in self.nodes)

    def prepare(self) -> None:
        """Writes every node's configuration, and formats every node of a new cluster (none
        formatted yet) with one cluster id and the same initial voters.

        Raises KafkaUnavailable when java is missing, a format fails, or some nodes lost their
        storage (see the module doc: formatting them now could lose records the others hold).
        """
        self.home.mkdir(parents=True, exist_ok=True)
        self.log4j.write_text(render_log4j2())
        self.tools_log4j.write_text(render_tools_log4j2())
        for node in self.nodes:
            self.properties(node.node_id).parent.mkdir(parents=True, exist_ok=True)
            self.properties(node.node_id).write_text(render_server_properties(node, self.quorum))
        lost = [n.node_id for n in self.nodes if not read_meta_properties(n.data_dir)]
        if len(lost) == len(self.nodes):
            self._format_new_cluster()
        elif lost:
            raise KafkaUnavailable(
                f"Kafka nodes {lost} in {self.home} have no storage. Started empty while the "
                "cluster was down, a node can be made leader of the partitions it last held in "
                "sync, and their records would be lost: restore its data folder, or remove "
                f"{self.home} to start an empty cluster"
            )

    def cluster_id(self) -> str:
        """The id the formatted nodes share. Raises KafkaUnavailable if none is formatted or
        they disagree."""
        ids = {
            meta["cluster.id"]
            for node in self.nodes
            if (meta := read_meta_properties(node.data_dir))
        }
        if len(ids) != 1:
            raise KafkaUnavailable(
                f"the nodes in {self.home} should share one cluster id; they have {sorted(ids)}"
            )
        return ids.pop()

    def replace_disk(self, node_id: int) -> None:
        """Gives the stopped node ``node_id`` an empty disk, as after a disk failure: deletes
        its data folder and formats it to join this cluster again (same cluster id and node
        id, a new directory id). Start it, then make it a voter with :meth:`join_quorum`.

        Raises KafkaUnavailable, leaving the folder alone, while the node runs, or unless the
        other nodes answer and, for every partition with a replica on it, one of them is in
        sync (else Kafka could elect the empty replica over theirs, see the module doc).
        Wait until the controller has fenced the stopped node (:meth:`listed_in_sync` False)
        first: a node restarted with an empty disk before that keeps its place in sync.
        """
        if self._running(node_id):
            raise KafkaUnavailable(f"node {node_id} is running: stop or kill it first")
        exposed = partitions_held_only_by(node_id, self._bootstrap_without(node_id))
        if exposed:
            raise KafkaUnavailable(
                f"no other node holds these partitions in sync, so node {node_id} could be "
                f"elected their leader with an empty log: {', '.join(exposed[:10])}"
            )
        cluster_id = self.cluster_id()
        shutil.rmtree(self.node(node_id).data_dir, ignore_errors=True)
        self._format(self.node(node_id), cluster_id, JOIN_EXISTING)

    def listed_in_sync(self, node_id: int) -> bool:
        """Whether the other nodes still list ``node_id`` in the in-sync replicas of some
        partition. A killed node is taken out once the controller fences it
        (``broker.session.timeout.ms``); one that restarts before that keeps its place, so
        its disk must not be replaced until this is False (see :meth:`replace_disk`)."""
        return any(
            node_id in partition.isrs and len(partition.replicas) > 1
            for _, partition in _partitions(
                self._bootstrap_without(node_id), "the other Kafka nodes"
            )
        )

    def lagging(self) -> list[str]:
        """:func:`partitions_lagging` of this cluster."""
        return partitions_lagging(self.bootstrap)

    def _bootstrap_without(self, node_id: int) -> str:
        return ",".join(node.bootstrap for node in self.nodes if node.node_id != node_id)

    def _format_new_cluster(self) -> None:
        directory_ids = {node.node_id: new_cluster_id() for node in self.nodes}
        initial = ("--initial-controllers", self.quorum.initial_controllers(directory_ids))
        cluster_id = new_cluster_id()
        try:
            for node in self.nodes:
                self._format(node, cluster_id, initial)
        except KafkaUnavailable:
            # Half formatted, it would be refused at the next start as one with lost disks.
            for node in self.nodes:
                shutil.rmtree(node.data_dir, ignore_errors=True)
            raise

    def _format(self, node: KafkaNode, cluster_id: str, options: Sequence[str]) -> None:
        argv = format_command(
            find_java(),
            self.libs,
            self.log4j,
            cluster_id,
            self.properties(node.node_id),
            quorum_options=options,
        )
        result = subprocess.run(
            argv, capture_output=True, text=True, check=False, stdin=subprocess.DEVNULL
        )
        if result.returncode != 0:
            raise KafkaUnavailable(
                f"formatting Kafka storage in {node.data_dir} failed:\n"
                f"{result.stdout}{result.stderr}"
            )

    # Running, on a caller's stack or on this object's own children.

    def child_spec(self, node_id: int) -> ChildSpec:
        """How to run node ``node_id`` (after :meth:`prepare`)."""
        argv = broker_command(
            find_java(), self.libs, self.heap, self.log4j, self.properties(node_id)
        )
        return ChildSpec(
            name=f"kafka-{node_id}",
            argv=tuple(argv),
            log_path=self.log_path(node_id),
            cwd=self.home / f"node-{node_id}",
            stop_timeout_s=STOP_TIMEOUT_S,
        )

    def answers(self) -> bool:
        """Whether every node's broker is registered and unfenced, as clients see it."""
        return registered_brokers(self.bootstrap) == {node.node_id for node in self.nodes}

    def voters(self) -> dict[int, str]:
        """The quorum's voters now: node id → directory id. Raises KafkaUnavailable when the
        controllers do not answer."""
        return parse_voters(self._quorum_tool("describe", "--status"))

    def join_quorum(self, node_id: int, timeout_s: float) -> None:
        """Makes the running node ``node_id`` a voter with the metadata log it has now.

        Removes the voter it replaces (its node id with another directory id) and then adds
        it, each once the quorum accepts it (the leader adds a voter only once it has caught
        up). Does nothing when it votes already. Raises KafkaUnavailable after ``timeout_s``.
        """
        directory = read_meta_properties(self.node(node_id).data_dir).get("directory.id")
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if self._swap_voter(node_id, directory):
                    return
            except KafkaUnavailable as error:
                if time.monotonic() >= deadline:
                    raise KafkaUnavailable(
                        f"node {node_id} did not become a voter within {timeout_s:g}s: {error}"
                    ) from error
                time.sleep(RETRY_PAUSE_S)

    def _swap_voter(self, node_id: int, directory: str | None) -> bool:
        """One step towards ``node_id`` voting with ``directory``; True once it does."""
        voters = self.voters()
        if voters.get(node_id) == directory:
            return True
        if node_id in voters:
            self._quorum_tool(
                "remove-controller",
                *("--controller-id", str(node_id)),
                *("--controller-directory-id", voters[node_id]),
            )
        else:
            self._quorum_tool("--command-config", str(self.properties(node_id)), "add-controller")
        return False

    def _quorum_tool(self, *arguments: str) -> str:
        argv = quorum_command(
            find_java(), self.libs, self.tools_log4j, self.quorum.bootstrap_servers, *arguments
        )
        try:
            result = subprocess.run(
                argv,
                capture_output=True,
                text=True,
                check=False,
                stdin=subprocess.DEVNULL,
                timeout=TOOL_TIMEOUT_S,
            )
        except subprocess.TimeoutExpired as error:
            raise KafkaUnavailable(f"kafka-metadata-quorum {arguments[0]} hung") from error
        if result.returncode != 0:
            raise KafkaUnavailable(
                f"kafka-metadata-quorum {' '.join(arguments)} failed:\n"
                f"{result.stdout}{result.stderr}".strip()
            )
        return result.stdout

    def start(self, timeout_s: float = 120.0) -> None:
        """Prepares and starts every node as a child of this process, and waits until every
        broker answers. Raises KafkaUnavailable; what did start runs until :meth:`stop`."""
        self.prepare()
        for node in self.nodes:
            self.start_node(node.node_id)
        self.wait_until_answering(timeout_s)

    def wait_until_answering(self, timeout_s: float) -> None:
        """Returns once every broker answers (:meth:`answers`). Raises KafkaUnavailable when a
        node started here exits, or after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while not self.answers():
            for node_id, child in self._children.items():
                if child.exit_code() is not None:
                    raise KafkaUnavailable(
                        f"Kafka node {node_id} exited with code {child.exit_code()}; "
                        f"last lines of {child.spec.log_path}:\n{child.log_tail()}"
                    )
            if time.monotonic() >= deadline:
                raise KafkaUnavailable(f"the Kafka cluster did not answer within {timeout_s:g}s")
            time.sleep(POLL_S)

    def start_node(self, node_id: int) -> None:
        """Starts node ``node_id`` as a child of this process (it must not be running)."""
        if self._running(node_id):
            raise KafkaUnavailable(f"node {node_id} is running already")
        child = Child(self.child_spec(node_id))
        child.start()
        self._children[node_id] = child

    def stop_node(self, node_id: int) -> None:
        """Stops node ``node_id`` cleanly (SIGTERM: its broker hands its partitions over first),
        or kills it when too few nodes run for that (see :meth:`_quorum_runs`)."""
        if not self._quorum_runs():
            self.kill_node(node_id)
            return
        child = self._children.get(node_id)
        if child is not None:
            child.stop()

    def kill_node(self, node_id: int) -> None:
        """Kills node ``node_id`` at once (SIGKILL to its process group), as a crash would."""
        child = self._children.get(node_id)
        if child is None or child.pid is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)
        child.stop()

    def stop(self) -> None:
        """Stops every node started here, all at once: one by one, the last would wait for a
        quorum that left before it. Kills them when too few run for a clean stop."""
        if not self._quorum_runs():
            for node in self.nodes:
                self.kill_node(node.node_id)
        stop_together(list(self._children.values()))

    def _quorum_runs(self) -> bool:
        """Whether a majority of the nodes runs here. A broker stops cleanly only once the
        controllers approve (they move its partitions' leadership away first); without a
        quorum to do so it waits, for minutes, until it is killed."""
        running = sum(1 for node in self.nodes if self._running(node.node_id))
        return 2 * running > len(self.nodes)

    def _running(self, node_id: int) -> bool:
        child = self._children.get(node_id)
        return child is not None and child.running()
