from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import SecretStr

from cli.redis_local import RedisNode, RedisTls, render_redis_conf


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


def test_with_tls_files_its_one_port_speaks_tls_and_the_url_names_the_authority() -> None:
    tls = RedisTls(Path("/t/chain.pem"), Path("/t/key.pem"), Path("/t/ca.pem"))
    node = RedisNode(16379, Path("/d"), password=SecretStr("redis-pw"), tls=tls)
    lines = render_redis_conf(node).splitlines()
    assert "port 0" in lines
    assert "tls-port 16379" in lines
    assert 'tls-cert-file "/t/chain.pem"' in lines
    assert 'tls-key-file "/t/key.pem"' in lines
    assert node.url == "rediss://:redis-pw@127.0.0.1:16379/0?ssl_ca_certs=/t/ca.pem"
