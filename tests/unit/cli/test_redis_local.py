from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import SecretStr

from cli.redis_local import RedisNode, render_redis_conf


def test_redis_listens_on_loopback_and_keeps_an_append_only_file() -> None:
    node = RedisNode(port=16379, data_dir=Path("/d/redis/data"))
    lines = render_redis_conf(node).splitlines()
    assert "bind 127.0.0.1" in lines
    assert "port 16379" in lines
    assert "appendonly yes" in lines
    assert 'dir "/d/redis/data"' in lines
    assert "daemonize no" in lines
    assert node.url == "redis://127.0.0.1:16379/0"


def test_a_password_is_required_of_clients_and_carried_by_the_url() -> None:
    node = RedisNode(port=16379, data_dir=Path("/d"), password=SecretStr("redis-pw"))
    assert "requirepass redis-pw" in render_redis_conf(node).splitlines()
    assert node.url == "redis://:redis-pw@127.0.0.1:16379/0"
    assert "redis-pw" not in repr(node)
    assert "requirepass" not in render_redis_conf(RedisNode(16379, Path("/d")))
    with pytest.raises(ValueError, match="letters, digits"):
        RedisNode(16379, Path("/d"), password=SecretStr("pass word"))
