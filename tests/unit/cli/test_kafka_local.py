from __future__ import annotations

import base64
import uuid
from pathlib import Path

import pytest
from pydantic import SecretStr

from cli.kafka_local import (
    BrokerTls,
    KafkaNode,
    Quorum,
    broker_command,
    format_command,
    min_insync_replicas,
    new_cluster_id,
    render_server_properties,
)


def parse(properties: str) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in properties.splitlines() if line and line[0] != "#")
    return {key: value for key, value in pairs}


NODE = KafkaNode(port=19092, controller_port=19093, data_dir=Path("/d/kafka/data"))


def test_the_broker_is_its_own_controller_on_loopback() -> None:
    config = parse(render_server_properties(NODE))
    assert config["process.roles"] == "broker,controller"
    assert config["controller.quorum.voters"] == "1@127.0.0.1:19093"
    assert config["listeners"] == "PLAINTEXT://127.0.0.1:19092,CONTROLLER://127.0.0.1:19093"
    assert config["advertised.listeners"] == "PLAINTEXT://127.0.0.1:19092"
    assert config["log.dirs"] == "/d/kafka/data"


def test_topics_are_never_created_implicitly() -> None:
    assert parse(render_server_properties(NODE))["auto.create.topics.enable"] == "false"


def test_internal_topics_fit_a_single_broker_and_groups_start_at_once() -> None:
    config = parse(render_server_properties(NODE))
    assert config["offsets.topic.replication.factor"] == "1"
    assert config["transaction.state.log.replication.factor"] == "1"
    assert config["transaction.state.log.min.isr"] == "1"
    assert config["group.initial.rebalance.delay.ms"] == "0"


def test_bootstrap_names_the_plaintext_listener() -> None:
    assert NODE.bootstrap == "127.0.0.1:19092"


def test_cluster_ids_are_sixteen_random_bytes_in_url_safe_base64() -> None:
    first, second = new_cluster_id(), new_cluster_id()
    assert first != second
    assert len(first) == 22
    assert len(base64.urlsafe_b64decode(first + "==")) == 16


def test_a_cluster_id_never_starts_with_a_dash(monkeypatch: pytest.MonkeyPatch) -> None:
    # 0xF8 encodes as "-": the storage tool took such an id for an option
    drawn = iter([uuid.UUID(bytes=b"\xf8" + bytes(15)), uuid.UUID(bytes=b"\x01" * 16)])
    monkeypatch.setattr("cli.kafka_local.uuid.uuid4", lambda: next(drawn))
    assert new_cluster_id() == base64.urlsafe_b64encode(b"\x01" * 16).decode().rstrip("=")


def test_the_broker_runs_from_the_cached_jars_with_a_bounded_heap() -> None:
    argv = broker_command(
        "java", Path("/c/libs"), "512m", Path("/k/log4j2.properties"), Path("/k/s")
    )
    assert argv[0] == "java"
    assert "-Xmx512m" in argv
    assert argv[argv.index("-cp") + 1] == "/c/libs/*"
    assert "-Dlog4j2.configurationFile=/k/log4j2.properties" in argv
    assert argv[-2:] == ["kafka.Kafka", "/k/s"]


def test_storage_is_formatted_with_the_given_cluster_id() -> None:
    argv = format_command("java", Path("/c/libs"), Path("/k/l"), "abc", Path("/k/s"))
    assert argv[argv.index("kafka.tools.StorageTool") + 1] == "format"
    assert argv[argv.index("--cluster-id") + 1] == "abc"
    assert argv[argv.index("--config") + 1] == "/k/s"


SASL_NODE = KafkaNode(
    port=19092,
    controller_port=19093,
    data_dir=Path("/d/kafka/data"),
    scram_users=(("broker", SecretStr("broker-pw")), ("setu", SecretStr("setu-pw"))),
)


def test_with_scram_users_the_one_client_listener_takes_only_scram_logins() -> None:
    config = parse(render_server_properties(SASL_NODE))
    assert config["listeners"] == "SASL_PLAINTEXT://127.0.0.1:19092,CONTROLLER://127.0.0.1:19093"
    assert config["advertised.listeners"] == "SASL_PLAINTEXT://127.0.0.1:19092"
    assert config["listener.security.protocol.map"] == (
        "SASL_PLAINTEXT:SASL_PLAINTEXT,CONTROLLER:PLAINTEXT"
    )
    assert config["sasl.enabled.mechanisms"] == "SCRAM-SHA-256"
    # The broker reaches itself through the same listener, as the first user
    assert config["inter.broker.listener.name"] == "SASL_PLAINTEXT"
    assert config["sasl.mechanism.inter.broker.protocol"] == "SCRAM-SHA-256"
    assert config["listener.name.sasl_plaintext.scram-sha-256.sasl.jaas.config"] == (
        "org.apache.kafka.common.security.scram.ScramLoginModule required "
        'username="broker" password="broker-pw";'
    )
    assert SASL_NODE.protocol == "SASL_PLAINTEXT" and NODE.protocol == "PLAINTEXT"


def test_scram_users_are_written_into_the_storage_when_it_is_formatted() -> None:
    argv = format_command(
        "java", Path("/c/libs"), Path("/k/l"), "abc", Path("/k/s"), SASL_NODE.scram_users
    )
    assert argv[-2:] == [
        "--add-scram=SCRAM-SHA-256=[name=broker,password=broker-pw]",
        "--add-scram=SCRAM-SHA-256=[name=setu,password=setu-pw]",
    ]
    # A node without users formats without any
    plain = format_command("java", Path("/c/libs"), Path("/k/l"), "abc", Path("/k/s"))
    assert not any(arg.startswith("--add-scram") for arg in plain)


def test_scram_passwords_that_would_need_quoting_are_refused() -> None:
    with pytest.raises(ValueError, match="letters, digits"):
        KafkaNode(1, 2, Path("/d"), scram_users=(("setu", SecretStr("a,b]")),))


def test_with_tls_files_the_listener_speaks_tls_with_the_pem_files_as_they_are() -> None:
    tls = BrokerTls(keystore=Path("/t/broker.pem"), truststore=Path("/t/ca.pem"))
    node = KafkaNode(19092, 19093, Path("/d"), scram_users=SASL_NODE.scram_users, tls=tls)
    config = parse(render_server_properties(node))
    assert config["listeners"] == "SASL_SSL://127.0.0.1:19092,CONTROLLER://127.0.0.1:19093"
    assert config["listener.security.protocol.map"] == "SASL_SSL:SASL_SSL,CONTROLLER:PLAINTEXT"
    assert "listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config" in config
    assert config["ssl.keystore.type"] == config["ssl.truststore.type"] == "PEM"
    assert config["ssl.keystore.location"] == "/t/broker.pem"
    assert config["ssl.truststore.location"] == "/t/ca.pem"
    # TLS without users: SSL
    assert KafkaNode(19092, 19093, Path("/d"), tls=tls).protocol == "SSL"


QUORUM = Quorum(((1, 19093), (2, 19095), (3, 19097)))


def cluster_node(node_id: int) -> KafkaNode:
    port, controller = 19090 + 2 * node_id, 19091 + 2 * node_id
    return KafkaNode(port, controller, Path(f"/d/node-{node_id}/data"), node_id=node_id)


def test_a_cluster_node_finds_every_voter_through_the_bootstrap_servers() -> None:
    config = parse(render_server_properties(cluster_node(2), QUORUM))
    assert config["process.roles"] == "broker,controller"
    assert config["node.id"] == "2"
    assert config["controller.quorum.bootstrap.servers"] == (
        "127.0.0.1:19093,127.0.0.1:19095,127.0.0.1:19097"
    )
    # A dynamic quorum: no static voters
    assert "controller.quorum.voters" not in config
    assert config["log.dirs"] == "/d/node-2/data"


def test_a_cluster_node_listens_and_advertises_its_own_ports_for_clients_and_the_quorum() -> None:
    config = parse(render_server_properties(cluster_node(3), QUORUM))
    assert config["listeners"] == "PLAINTEXT://127.0.0.1:19096,CONTROLLER://127.0.0.1:19097"
    # The controller address is what a voter is added with and reached at
    assert config["advertised.listeners"] == (
        "PLAINTEXT://127.0.0.1:19096,CONTROLLER://127.0.0.1:19097"
    )
    assert config["controller.listener.names"] == "CONTROLLER"
    assert config["inter.broker.listener.name"] == "PLAINTEXT"


def test_a_cluster_keeps_three_replicas_of_internal_topics_and_takes_writes_on_two() -> None:
    config = parse(render_server_properties(cluster_node(1), QUORUM))
    assert config["default.replication.factor"] == "3"
    assert config["min.insync.replicas"] == "2"
    assert config["offsets.topic.replication.factor"] == "3"
    assert config["transaction.state.log.replication.factor"] == "3"
    assert config["transaction.state.log.min.isr"] == "2"
    assert config["share.coordinator.state.topic.replication.factor"] == "3"
    assert config["share.coordinator.state.topic.min.isr"] == "2"
    assert config["auto.create.topics.enable"] == "false"


def test_a_single_node_keeps_one_replica_and_its_static_voter() -> None:
    config = parse(render_server_properties(NODE))
    assert config["default.replication.factor"] == config["min.insync.replicas"] == "1"
    assert config["share.coordinator.state.topic.min.isr"] == "1"
    assert "controller.quorum.bootstrap.servers" not in config


def test_replication_follows_the_cluster_size_up_to_three() -> None:
    assert Quorum(((1, 9093),)).replication_factor == 1
    assert Quorum(((1, 9093), (2, 9095))).replication_factor == 2
    assert QUORUM.replication_factor == 3
    assert Quorum(tuple((n, 9091 + 2 * n) for n in range(1, 6))).replication_factor == 3
    assert [min_insync_replicas(n) for n in (1, 2, 3, 5)] == [1, 1, 2, 2]


def test_a_new_cluster_is_formatted_with_every_voter_and_its_directory() -> None:
    voters = QUORUM.initial_controllers({1: "dirA", 2: "dirB", 3: "dirC"})
    assert voters == "1@127.0.0.1:19093:dirA,2@127.0.0.1:19095:dirB,3@127.0.0.1:19097:dirC"
    argv = format_command(
        "java",
        Path("/c/libs"),
        Path("/k/l"),
        "abc",
        Path("/k/s"),
        quorum_options=("--initial-controllers", voters),
    )
    assert argv[argv.index("--initial-controllers") + 1] == voters
    assert argv[argv.index("--cluster-id") + 1] == "abc"
