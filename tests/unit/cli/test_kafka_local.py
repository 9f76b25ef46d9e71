from __future__ import annotations

import base64
from pathlib import Path

from cli.kafka_local import (
    KafkaNode,
    broker_command,
    format_command,
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
