"""``setu deliver --check``: the probe the chart's workers run, against the real Redis."""

from __future__ import annotations

import uuid

import pytest
import redis

from cli.commands import check_deliver
from setu.settings import Settings
from state import keys

pytestmark = pytest.mark.integration


def test_the_worker_probe_passes_only_while_its_heartbeat_lives(
    redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = Settings(redis_url=redis_url, worker_id=f"probe-{uuid.uuid4().hex[:8]}")
    # Given no heartbeat of this worker: the probe fails, saying why
    assert check_deliver(settings) == 1
    assert "no heartbeat" in capsys.readouterr().err
    # When the worker writes its heartbeat, the probe passes
    client = redis.Redis.from_url(redis_url)
    key = keys.worker_heartbeat(settings.worker_id or "")
    try:
        client.set(key, b"1", ex=10)
        assert check_deliver(settings) == 0
    finally:
        client.delete(key)
        client.close()
    # And without Redis configured it fails, naming the setting
    assert check_deliver(Settings(redis_url=None)) == 1
    assert "SETU_REDIS_URL" in capsys.readouterr().err
