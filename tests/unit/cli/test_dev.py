from __future__ import annotations

import socket
from pathlib import Path

import pytest
from pydantic import ValidationError

from cli.dev import (
    dev_admin_key,
    dev_secret_key,
    dev_up,
    replication_env,
    stack_env,
    summary,
)
from cli.dev_settings import DevSettings
from cli.kafka_cluster import LocalKafkaCluster, NodePorts
from cli.main import build_parser, dev_settings
from cli.ports import PortBusy
from cli.services import cluster_default_ports, cluster_port_names, refuse_moved_controllers
from setu.settings import Settings
from state.sealing import Sealer


def test_children_get_every_dependency_and_may_call_loopback_webhooks() -> None:
    env = stack_env(
        "127.0.0.1:19092",
        "redis://127.0.0.1:16379/0",
        "sqlite:////d/setu.db",
        Path("/d"),
        Path("/c"),
        "127.0.0.1",
        18080,
        19465,
        19464,
        18070,
    )
    assert env["SETU_KAFKA_BOOTSTRAP"] == "127.0.0.1:19092"
    assert env["SETU_REDIS_URL"] == "redis://127.0.0.1:16379/0"
    assert env["SETU_DATABASE_URL"] == "sqlite:////d/setu.db"
    assert env["SETU_DATA_DIR"] == "/d"
    assert env["SETU_API_PORT"] == "18080"
    assert env["SETU_ALLOW_PRIVATE_ENDPOINTS"] == "true"
    assert env["SETU_INGEST_METRICS_PORT"] == "19465"
    assert env["SETU_DELIVERY_METRICS_PORT"] == "19464"
    assert env["SETU_STREAM_PORT"] == "18070"


def test_the_summary_says_where_the_api_is() -> None:
    env = {
        "SETU_KAFKA_BOOTSTRAP": "127.0.0.1:19092",
        "SETU_REDIS_URL": "redis://127.0.0.1:16379/0",
        "SETU_DATABASE_URL": "sqlite:////d/setu.db",
        "SETU_INGEST_METRICS_PORT": "19465",
        "SETU_DELIVERY_METRICS_PORT": "19464",
        "SETU_STREAM_PORT": "18070",
        "SETU_ADMIN_KEY": "setu_admin_k3y",
    }
    text = summary("http://127.0.0.1:18080", True, env, Path("/d/logs"))
    assert "API       http://127.0.0.1:18080" in text
    assert "Streaming 127.0.0.1:18070" in text
    assert "ingest http://127.0.0.1:19465/metrics" in text
    assert "worker http://127.0.0.1:19464/metrics" in text
    assert "127.0.0.1:19092" in text
    assert "/d/logs" in text
    assert "Ingest    running" in text
    assert "  export SETU_API_KEY=setu_admin_k3y" in text
    # (and where the API is, for `setu` on another port than its default 8080)
    assert "  export SETU_API_URL=http://127.0.0.1:18080" in text
    waiting = summary("http://127.0.0.1:18080", True, env, Path("/d/logs"), ingest_up=False)
    assert "Ingest    not running yet: see /d/logs/ingest.log" in waiting


def test_the_summary_shows_no_password_of_redis_or_the_database() -> None:
    env = {
        "SETU_KAFKA_BOOTSTRAP": "kafka.example:9093",
        "SETU_REDIS_URL": "rediss://:redis-pw-4e1@cache.example:6380/0",
        "SETU_DATABASE_URL": "postgresql+psycopg://setu:db-pw-77a@db.example/setu?sslmode=require",
        "SETU_ADMIN_KEY": "setu_admin_k3y",
    }
    text = summary("http://127.0.0.1:18080", True, env, Path("/d/logs"))
    assert "redis-pw-4e1" not in text
    assert "db-pw-77a" not in text
    assert "Redis     rediss://:***@cache.example:6380/0" in text
    assert "Database  postgresql+psycopg://setu:***@db.example/setu?sslmode=require" in text


def test_dev_up_makes_an_admin_key_once_and_keeps_it_for_its_owner(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SETU_ADMIN_KEY", raising=False)
    settings = Settings(data_dir=tmp_path)
    key = dev_admin_key(settings, tmp_path)
    assert len(key) >= 40
    assert (tmp_path / "admin-key").stat().st_mode & 0o777 == 0o600
    assert dev_admin_key(settings, tmp_path) == key
    # SETU_ADMIN_KEY, when set, is the key
    chosen = Settings(data_dir=tmp_path, admin_key="an-admin-key-of-my-own-choosing")
    assert dev_admin_key(chosen, tmp_path) == "an-admin-key-of-my-own-choosing"


def test_dev_up_makes_a_sealing_key_once_and_keeps_it_for_its_owner(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SETU_SECRET_KEY", raising=False)
    settings = Settings(data_dir=tmp_path)
    key = dev_secret_key(settings, tmp_path)
    # A key that seals and opens, kept for its owner only and the same at the next start
    assert Sealer([key]).open(Sealer([key]).seal("v")) == "v"
    assert (tmp_path / "secret-key").stat().st_mode & 0o777 == 0o600
    assert dev_secret_key(settings, tmp_path) == key
    # SETU_SECRET_KEY, when set, is the key
    own = Sealer.new_key()
    assert dev_secret_key(Settings(data_dir=tmp_path, secret_key=own), tmp_path) == own


def test_three_brokers_take_the_usual_ports_pair_after_pair() -> None:
    assert cluster_default_ports(3) == {
        "kafka": 9092,
        "kafka_controller": 9093,
        "kafka_2": 9094,
        "kafka_controller_2": 9095,
        "kafka_3": 9096,
        "kafka_controller_3": 9097,
    }
    # The first node's are the single broker's, which SETU_DEV_KAFKA_*PORT ask for
    assert cluster_port_names(1) == ("kafka", "kafka_controller")
    assert cluster_default_ports(1) == {"kafka": 9092, "kafka_controller": 9093}


def formatted_cluster(home: Path) -> LocalKafkaCluster:
    ports = [NodePorts(19092, 19093), NodePorts(19094, 19195), NodePorts(19096, 19197)]
    cluster = LocalKafkaCluster(home, ports, Path("/c/libs"), home / "logs")
    for node in cluster.nodes:
        node.data_dir.mkdir(parents=True)
        (node.data_dir / "meta.properties").write_text(f"cluster.id=c\nnode.id={node.node_id}\n")
    return cluster


def test_one_controller_of_a_formatted_cluster_may_move_but_not_two(tmp_path: Path) -> None:
    cluster = formatted_cluster(tmp_path / "kafka-cluster")
    last_time = {"kafka_controller": 19093, "kafka_controller_2": 19095}
    refuse_moved_controllers(cluster, last_time)  # node 2 moved: it finds the others
    last_time["kafka_controller_3"] = 19097
    with pytest.raises(PortBusy, match=r"nodes \[2, 3\] \(\[19095, 19097\]\) are taken"):
        refuse_moved_controllers(cluster, last_time)


def test_a_cluster_not_formatted_yet_may_take_any_ports(tmp_path: Path) -> None:
    ports = [NodePorts(1, 2), NodePorts(3, 4), NodePorts(5, 6)]
    cluster = LocalKafkaCluster(tmp_path, ports, Path("/c/libs"), tmp_path / "logs")
    remembered = {"kafka_controller": 9, "kafka_controller_2": 10, "kafka_controller_3": 11}
    refuse_moved_controllers(cluster, remembered)


def test_a_cluster_gives_setus_topics_its_replication_unless_it_was_chosen(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("SETU_KAFKA_REPLICATION_FACTOR", raising=False)
    assert replication_env(Settings(), 3) == {"SETU_KAFKA_REPLICATION_FACTOR": "3"}
    assert replication_env(Settings(kafka_replication_factor=2), 3) == {}


def test_the_summary_lists_every_broker_and_the_replicas_of_topics() -> None:
    env = {
        "SETU_KAFKA_BOOTSTRAP": "127.0.0.1:9092,127.0.0.1:9094,127.0.0.1:9096",
        "SETU_KAFKA_REPLICATION_FACTOR": "3",
        "SETU_REDIS_URL": "redis://127.0.0.1:16379/0",
        "SETU_DATABASE_URL": "sqlite:////d/setu.db",
        "SETU_ADMIN_KEY": "setu_admin_k3y",
    }
    text = summary("http://127.0.0.1:18080", True, env, Path("/d/logs"))
    assert (
        "  Kafka     127.0.0.1:9092,127.0.0.1:9094,127.0.0.1:9096  (topics with 3 replicas)"
        in text.splitlines()
    )
    del env["SETU_KAFKA_REPLICATION_FACTOR"]
    single = summary("http://127.0.0.1:18080", True, {**env, "SETU_KAFKA_BOOTSTRAP": "h:1"}, Path())
    assert "  Kafka     h:1" in single.splitlines()


@pytest.mark.parametrize(
    ("argv", "variable", "brokers"),
    [
        (["dev", "up"], None, 1),
        (["dev", "up", "--brokers", "3"], None, 3),
        (["dev", "up"], "3", 3),
        (["dev", "up", "--brokers", "1"], "3", 1),  # the option wins over the variable
    ],
)
def test_brokers_come_from_the_option_or_the_variable(
    argv: list[str], variable: str | None, brokers: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    if variable is None:
        monkeypatch.delenv("SETU_DEV_KAFKA_BROKERS", raising=False)
    else:
        monkeypatch.setenv("SETU_DEV_KAFKA_BROKERS", variable)
    assert dev_settings(build_parser().parse_args(argv)).kafka_brokers == brokers


def test_only_one_or_three_brokers_are_offered(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["dev", "up", "--brokers", "2"])
    monkeypatch.setenv("SETU_DEV_KAFKA_BROKERS", "2")
    with pytest.raises(ValidationError, match="must be one of"):
        DevSettings()


def test_a_port_asked_for_and_taken_stops_dev_up_before_anything_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given something already listening where SETU_API_PORT asks the API to
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        monkeypatch.setenv("SETU_API_PORT", str(port))
        monkeypatch.setenv("SETU_DATA_DIR", str(tmp_path))
        said: list[str] = []
        # When dev up starts
        code = dev_up(Settings(), DevSettings(), said.append)
    # Then it fails at once, naming the variable and the port, and started nothing
    assert code == 1
    assert any(f"SETU_API_PORT={port}" in line and "already in use" in line for line in said)
    assert not any(line.startswith("starting") for line in said), said
    assert not (tmp_path / "kafka").exists()
