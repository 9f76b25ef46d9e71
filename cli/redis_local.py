"""A local ``redis-server`` on loopback with its data (AOF on) in one folder."""

from __future__ import annotations

import re
import shutil
import signal
from dataclasses import dataclass
from pathlib import Path

from pydantic import SecretStr

from cli.ports import LOOPBACK
from cli.processes import ChildSpec

DEFAULT_PORT = 6379
# What a password may hold here: no quoting in redis.conf, no escaping in the URL.
_PLAIN = re.compile(r"[A-Za-z0-9._~-]+")


class RedisUnavailable(Exception):
    """Raised when redis-server is not installed."""


@dataclass(frozen=True)
class RedisNode:
    """Where one local Redis listens and keeps its data; with a password, clients must send it
    (``requirepass``: the URL carries it, docs/security.md §5)."""

    port: int
    data_dir: Path
    host: str = LOOPBACK
    password: SecretStr | None = None

    def __post_init__(self) -> None:
        if self.password is not None and not _PLAIN.fullmatch(self.password.get_secret_value()):
            raise ValueError("a local Redis password: use letters, digits and ._~- only")

    @property
    def url(self) -> str:
        login = f":{self.password.get_secret_value()}@" if self.password is not None else ""
        return f"redis://{login}{self.host}:{self.port}/0"


def render_redis_conf(node: RedisNode) -> str:
    """redis.conf for a loopback-only server that survives restarts (AOF, fsync every second)."""
    return (
        f"bind {node.host}\n"
        f"port {node.port}\n"
        "protected-mode yes\n"
        "daemonize no\n"
        f'dir "{node.data_dir}"\n'
        "appendonly yes\n"
        "appendfsync everysec\n"
        'logfile ""\n'
        + (f"requirepass {node.password.get_secret_value()}\n" if node.password else "")
    )


class LocalRedis:
    """A Redis whose configuration and data live in ``home``."""

    def __init__(self, home: Path, node: RedisNode, log_path: Path) -> None:
        self.home = home
        self.node = node
        self.log_path = log_path
        self.conf = home / "redis.conf"

    def prepare(self) -> None:
        """Writes the configuration. Raises RedisUnavailable when redis-server is missing."""
        self.home.mkdir(parents=True, exist_ok=True)
        self.node.data_dir.mkdir(parents=True, exist_ok=True)
        self.conf.write_text(render_redis_conf(self.node))

    def child_spec(self) -> ChildSpec:
        server = shutil.which("redis-server")
        if server is None:
            raise RedisUnavailable("redis-server is not installed: run scripts/install")
        # SIGTERM makes Redis flush the AOF and exit cleanly.
        return ChildSpec(
            name="redis",
            argv=(server, str(self.conf)),
            log_path=self.log_path,
            cwd=self.home,
            stop_signal=signal.SIGTERM,
        )
