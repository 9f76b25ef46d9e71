"""Throwaway services started on this machine's own address (``setu services run --host``, so
that containers reach them: tests/install) let in only clients that show the password their URL
carries; on loopback they stay password-free."""

from __future__ import annotations

import shutil
import socket
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import redis

from cli.ports import LOOPBACK
from cli.services import PortPlan, start_postgres, start_redis
from cli.stack import Stack


def machine_address() -> str:
    """This machine's address on its first non-loopback interface."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("192.0.2.1", 9))  # no packet is sent: this only picks a route
        address = str(probe.getsockname()[0])
    assert address != LOOPBACK, "this machine has no address but loopback"
    return address


@pytest.fixture
def home() -> Iterator[Path]:
    """A folder PostgreSQL's own account can enter (it runs as that account when we are root;
    pytest's folders are the owner's only)."""
    path = Path(tempfile.mkdtemp(prefix="setu-services-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def stack() -> Iterator[Stack]:
    stack = Stack(threading.Event(), lambda line: None)
    try:
        yield stack
    finally:
        stack.stop_all()


def ports() -> PortPlan:
    return PortPlan(explicit={}, remembered={}, defaults={}, chosen={})


def test_postgres_off_loopback_needs_the_password_its_url_carries(home: Path, stack: Stack) -> None:
    host = machine_address()
    url = start_postgres(stack, home / "pg", home / "pg.log", ports(), 60, host)
    dsn = url.replace("postgresql+psycopg://", "postgresql://")
    # The URL's password lets a client in from the machine's address
    with psycopg.connect(dsn, connect_timeout=5) as conn:
        assert conn.execute("select 1").fetchone() == (1,)
    # Without it, the same client is refused
    login, rest = dsn.split("@", 1)
    without = login.rsplit(":", 1)[0] + "@" + rest
    with pytest.raises(psycopg.OperationalError, match="password"):
        psycopg.connect(without, connect_timeout=5).close()


def test_redis_off_loopback_needs_the_password_its_url_carries(
    tmp_path: Path, stack: Stack
) -> None:
    host = machine_address()
    url = start_redis(stack, tmp_path / "redis", tmp_path / "redis.log", ports(), 60, host)
    assert redis.Redis.from_url(url).ping()
    port = url.rsplit(":", 1)[1].split("/")[0]
    with pytest.raises(redis.AuthenticationError):
        redis.Redis(host=host, port=int(port)).ping()


def test_on_loopback_they_need_no_password(tmp_path: Path, stack: Stack) -> None:
    url = start_redis(stack, tmp_path / "redis", tmp_path / "redis.log", ports(), 60)
    assert url.startswith(f"redis://{LOOPBACK}:")
    assert redis.Redis.from_url(url).ping()
