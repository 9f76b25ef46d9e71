from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from cli.kafka_cluster import (
    LocalKafkaCluster,
    NodePorts,
    moved_controllers,
    parse_voters,
    quorum_command,
    read_meta_properties,
)
from cli.kafka_local import KafkaNode, KafkaUnavailable

PORTS = [NodePorts(19092, 19093), NodePorts(19094, 19095), NodePorts(19096, 19097)]

# What `kafka-metadata-quorum describe --status` printed for a three-node cluster.
STATUS = """\
ClusterId:              UtbrxVykRb2khHiTF5Sadg
LeaderId:               1
LeaderEpoch:            1
HighWatermark:          69
MaxFollowerLag:         0
MaxFollowerLagTimeMs:   0
CurrentVoters:          [{"id": 1, "directoryId": "eg7JJwVUTE6hnqe-8H4zZg", "endpoints": \
["CONTROLLER://127.0.0.1:21093"]}, {"id": 2, "directoryId": "LO9jJKjuRsCPGeJmQwYc9g", \
"endpoints": ["CONTROLLER://127.0.0.1:22093"]}, {"id": 3, "directoryId": \
"cpOfLIZmTeaxySHozTRc-g", "endpoints": ["CONTROLLER://127.0.0.1:23093"]}]
CurrentObservers:       []
"""


class Formats:
    """Stands in for the storage tool: records each format and writes meta.properties."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, str, tuple[str, ...]]] = []

    def __call__(self, node: KafkaNode, cluster_id: str, options: Sequence[str]) -> None:
        self.calls.append((node.node_id, cluster_id, tuple(options)))
        write_meta(node.data_dir, cluster_id, node.node_id, f"dir-{len(self.calls)}")


def write_meta(data_dir: Path, cluster_id: str, node_id: int, directory: str) -> None:
    data_dir.mkdir(parents=True, exist_ok=True)
    (data_dir / "meta.properties").write_text(
        f"#\n#Thu Nov 26 04:54:57 UTC 2026\nnode.id={node_id}\ndirectory.id={directory}\n"
        f"version=1\ncluster.id={cluster_id}\n"
    )


@pytest.fixture
def cluster(tmp_path: Path) -> LocalKafkaCluster:
    return LocalKafkaCluster(tmp_path / "kafka", PORTS, Path("/c/libs"), tmp_path / "logs")


@pytest.fixture
def formats(cluster: LocalKafkaCluster, monkeypatch: pytest.MonkeyPatch) -> Formats:
    recorded = Formats()
    monkeypatch.setattr(cluster, "_format", recorded)
    return recorded


def test_nodes_are_numbered_from_one_each_with_its_own_folder_and_ports(
    cluster: LocalKafkaCluster, tmp_path: Path
) -> None:
    assert [node.node_id for node in cluster.nodes] == [1, 2, 3]
    assert cluster.node(2).data_dir == tmp_path / "kafka" / "node-2" / "data"
    assert cluster.bootstrap == "127.0.0.1:19092,127.0.0.1:19094,127.0.0.1:19096"
    assert cluster.quorum.controllers == ((1, 19093), (2, 19095), (3, 19097))
    assert cluster.replication_factor == 3
    assert cluster.log_path(3) == tmp_path / "logs" / "kafka-3.log"


def test_a_new_cluster_formats_every_node_with_the_same_id_and_initial_voters(
    cluster: LocalKafkaCluster, formats: Formats
) -> None:
    cluster.prepare()
    assert [node_id for node_id, _, _ in formats.calls] == [1, 2, 3]
    assert len({cluster_id for _, cluster_id, _ in formats.calls}) == 1
    options = {options for _, _, options in formats.calls}
    assert len(options) == 1
    flag, voters = options.pop()
    assert flag == "--initial-controllers"
    assert [voter.rsplit(":", 1)[0] for voter in voters.split(",")] == [
        "1@127.0.0.1:19093",
        "2@127.0.0.1:19095",
        "3@127.0.0.1:19097",
    ]
    # Every node's configuration is written next to its data
    for node in cluster.nodes:
        text = cluster.properties(node.node_id).read_text()
        assert f"node.id={node.node_id}\n" in text
        assert "controller.quorum.bootstrap.servers=" in text


def test_a_formatted_cluster_is_not_formatted_again(
    cluster: LocalKafkaCluster, formats: Formats
) -> None:
    for node in cluster.nodes:
        write_meta(node.data_dir, "cid", node.node_id, f"d{node.node_id}")
    cluster.prepare()
    assert formats.calls == []


def test_a_stopped_cluster_with_a_node_without_storage_is_not_started(
    cluster: LocalKafkaCluster, formats: Formats
) -> None:
    # Empty, node 2 could be elected leader of what it last held in sync
    write_meta(cluster.node(1).data_dir, "cid", 1, "d1")
    write_meta(cluster.node(3).data_dir, "cid", 3, "d3")
    with pytest.raises(KafkaUnavailable, match=r"nodes \[2\] .* have no storage.*restore"):
        cluster.prepare()
    assert formats.calls == []


def test_nodes_of_different_clusters_are_refused(cluster: LocalKafkaCluster) -> None:
    write_meta(cluster.node(1).data_dir, "one", 1, "d1")
    write_meta(cluster.node(2).data_dir, "two", 2, "d2")
    with pytest.raises(KafkaUnavailable, match="one cluster id"):
        cluster.cluster_id()


def in_sync_elsewhere(monkeypatch: pytest.MonkeyPatch, exposed: list[str]) -> list[str]:
    """Answers in place of the other brokers; records whom replace_disk asked."""
    asked: list[str] = []

    def held_only_by(node_id: int, bootstrap: str) -> list[str]:
        asked.append(bootstrap)
        return exposed

    monkeypatch.setattr("cli.kafka_cluster.partitions_held_only_by", held_only_by)
    return asked


def test_a_replaced_disk_is_empty_and_formatted_with_the_clusters_id(
    cluster: LocalKafkaCluster, formats: Formats, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked = in_sync_elsewhere(monkeypatch, exposed=[])
    for node in cluster.nodes:
        write_meta(node.data_dir, "cid", node.node_id, f"d{node.node_id}")
    (cluster.node(2).data_dir / "numbers-0").mkdir()
    cluster.replace_disk(2)
    assert not (cluster.node(2).data_dir / "numbers-0").exists()
    assert formats.calls == [(2, "cid", ("--no-initial-controllers",))]
    # The other nodes were asked, not the one being replaced
    assert asked == ["127.0.0.1:19092,127.0.0.1:19096"]


def test_a_disk_is_not_replaced_while_only_it_holds_a_partition_in_sync(
    cluster: LocalKafkaCluster, formats: Formats, monkeypatch: pytest.MonkeyPatch
) -> None:
    in_sync_elsewhere(monkeypatch, exposed=["numbers-1"])
    for node in cluster.nodes:
        write_meta(node.data_dir, "cid", node.node_id, f"d{node.node_id}")
    with pytest.raises(KafkaUnavailable, match="numbers-1"):
        cluster.replace_disk(2)
    assert formats.calls == []
    assert read_meta_properties(cluster.node(2).data_dir)["directory.id"] == "d2"


class QuorumTool:
    """Stands in for kafka-metadata-quorum: a voter set the calls change as the real one."""

    def __init__(self, voters: dict[int, str], new_directory: str) -> None:
        self.voters = voters
        self.new_directory = new_directory
        self.calls: list[tuple[str, ...]] = []

    def __call__(self, *arguments: str) -> str:
        self.calls.append(arguments)
        if arguments[:2] == ("describe", "--status"):
            listed = ", ".join(
                f'{{"id": {node}, "directoryId": "{directory}", "endpoints": []}}'
                for node, directory in self.voters.items()
            )
            return f"LeaderId: 1\nCurrentVoters: [{listed}]\n"
        if arguments[0] == "remove-controller":
            del self.voters[int(arguments[2])]
        elif arguments[-1] == "add-controller":
            self.voters[2] = self.new_directory
        return ""


def test_a_reformatted_node_replaces_its_old_self_among_the_voters(
    cluster: LocalKafkaCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_meta(cluster.node(2).data_dir, "cid", 2, "new")
    tool = QuorumTool({1: "d1", 2: "old", 3: "d3"}, "new")
    monkeypatch.setattr(cluster, "_quorum_tool", tool)
    cluster.join_quorum(2, timeout_s=5)
    assert tool.voters == {1: "d1", 3: "d3", 2: "new"}
    changes = [call for call in tool.calls if call[0] != "describe"]
    assert changes == [
        ("remove-controller", "--controller-id", "2", "--controller-directory-id", "old"),
        ("--command-config", str(cluster.properties(2)), "add-controller"),
    ]


def test_a_node_that_votes_already_is_left_alone(
    cluster: LocalKafkaCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_meta(cluster.node(2).data_dir, "cid", 2, "d2")
    tool = QuorumTool({1: "d1", 2: "d2", 3: "d3"}, "unused")
    monkeypatch.setattr(cluster, "_quorum_tool", tool)
    cluster.join_quorum(2, timeout_s=5)
    assert [call[0] for call in tool.calls] == ["describe"]


def test_joining_gives_up_with_the_tools_last_answer(
    cluster: LocalKafkaCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_meta(cluster.node(2).data_dir, "cid", 2, "new")

    def refuses(*arguments: str) -> str:
        raise KafkaUnavailable("the controllers did not answer")

    monkeypatch.setattr(cluster, "_quorum_tool", refuses)
    monkeypatch.setattr("cli.kafka_cluster.RETRY_PAUSE_S", 0.0)
    with pytest.raises(KafkaUnavailable, match=r"did not become a voter.*did not answer"):
        cluster.join_quorum(2, timeout_s=0.05)


def test_voters_are_read_from_the_quorum_description() -> None:
    assert parse_voters(STATUS) == {
        1: "eg7JJwVUTE6hnqe-8H4zZg",
        2: "LO9jJKjuRsCPGeJmQwYc9g",
        3: "cpOfLIZmTeaxySHozTRc-g",
    }
    with pytest.raises(KafkaUnavailable, match="no voters"):
        parse_voters("LeaderId: 1\n")


def test_the_storage_identity_is_read_from_meta_properties(tmp_path: Path) -> None:
    assert read_meta_properties(tmp_path) == {}
    write_meta(tmp_path, "cid", 2, "dir")
    meta = read_meta_properties(tmp_path)
    assert (meta["cluster.id"], meta["node.id"], meta["directory.id"]) == ("cid", "2", "dir")


def test_the_quorum_tool_asks_every_controller() -> None:
    argv = quorum_command(
        "java", Path("/c/libs"), Path("/k/t"), "127.0.0.1:1,127.0.0.1:2", "describe", "--status"
    )
    assert argv[argv.index("-cp") + 1] == "/c/libs/*"
    assert argv[-5:] == [
        "org.apache.kafka.tools.MetadataQuorumCommand",
        "--bootstrap-controller",
        "127.0.0.1:1,127.0.0.1:2",
        "describe",
        "--status",
    ]


@pytest.mark.parametrize(
    ("now", "remembered", "moved"),
    [
        ({1: 9093, 2: 9095}, {1: 9093, 2: 9095}, []),
        ({1: 9093, 2: 9195}, {1: 9093, 2: 9095}, [2]),
        ({1: 9193, 2: 9195}, {1: 9093, 2: 9095}, [1, 2]),
        ({1: 9093, 2: 9095}, {}, []),  # nothing remembered: nothing moved
    ],
)
def test_moved_controllers(
    now: dict[int, int], remembered: dict[int, int], moved: list[int]
) -> None:
    assert moved_controllers(now, remembered) == moved
