from __future__ import annotations

from pathlib import Path

import pytest

from cli.dev import dev_admin_key, dev_secret_key, stack_env, summary
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
