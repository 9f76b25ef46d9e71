from __future__ import annotations

from pathlib import Path

from cli.dev import stack_env, summary


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
    )
    assert env["SETU_KAFKA_BOOTSTRAP"] == "127.0.0.1:19092"
    assert env["SETU_REDIS_URL"] == "redis://127.0.0.1:16379/0"
    assert env["SETU_DATABASE_URL"] == "sqlite:////d/setu.db"
    assert env["SETU_DATA_DIR"] == "/d"
    assert env["SETU_API_PORT"] == "18080"
    assert env["SETU_ALLOW_PRIVATE_ENDPOINTS"] == "true"
    assert env["SETU_INGEST_METRICS_PORT"] == "19465"
    assert env["SETU_DELIVERY_METRICS_PORT"] == "19464"


def test_the_summary_says_where_the_api_is() -> None:
    env = {
        "SETU_KAFKA_BOOTSTRAP": "127.0.0.1:19092",
        "SETU_REDIS_URL": "redis://127.0.0.1:16379/0",
        "SETU_DATABASE_URL": "sqlite:////d/setu.db",
        "SETU_INGEST_METRICS_PORT": "19465",
        "SETU_DELIVERY_METRICS_PORT": "19464",
    }
    text = summary("http://127.0.0.1:18080", True, env, Path("/d/logs"))
    assert "API       http://127.0.0.1:18080" in text
    assert "ingest http://127.0.0.1:19465/metrics" in text
    assert "worker http://127.0.0.1:19464/metrics" in text
    assert "127.0.0.1:19092" in text
    assert "/d/logs" in text
    assert "Ingest    running" in text
    waiting = summary("http://127.0.0.1:18080", True, env, Path("/d/logs"), ingest_up=False)
    assert "Ingest    not running yet: see /d/logs/ingest.log" in waiting
