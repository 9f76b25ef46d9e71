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
class RedisTls:
    """PEM files of a TLS-only Redis: its certificate, its key, and the authority that signed
    the certificate (which clients are given to check it)."""

    certificate: Path
    key: Path
    authority: Path


@dataclass(frozen=True)
class RedisNode:
    """Where one local Redis listens and keeps its data; with a password, clients must send it
    (``requirepass``), with TLS files it speaks TLS only. The URL carries both
    (docs/security.md §8)."""

    port: int
    data_dir: Path
    host: str = LOOPBACK
    password: SecretStr | None = None
    tls: RedisTls | None = None
    # (host, port) of the primary this node replicates, for a replica; None for a primary.
    replica_of: tuple[str, int] | None = None

    def __post_init__(self) -> None:
        if self.password is not None and not _PLAIN.fullmatch(self.password.get_secret_value()):
            raise ValueError("a local Redis password: use letters, digits and ._~- only")

    @property
    def url(self) -> str:
        login = f":{self.password.get_secret_value()}@" if self.password is not None else ""
        if self.tls is not None:
            return f"rediss://{login}{self.host}:{self.port}/0?ssl_ca_certs={self.tls.authority}"
        return f"redis://{login}{self.host}:{self.port}/0"


def render_redis_conf(node: RedisNode) -> str:
    """redis.conf for a loopback-only server that survives restarts (AOF, fsync every second);
    with TLS files its one port speaks TLS (clients need not show a certificate)."""
    lines = [f"bind {node.host}"]
    if node.tls is None:
        lines.append(f"port {node.port}")
    else:
        lines += [
            "port 0",
            f"tls-port {node.port}",
            f'tls-cert-file "{node.tls.certificate}"',
            f'tls-key-file "{node.tls.key}"',
            f'tls-ca-cert-file "{node.tls.authority}"',
            "tls-auth-clients no",
        ]
    lines += [
        "protected-mode yes",
        "daemonize no",
        f'dir "{node.data_dir}"',
        "appendonly yes",
        "appendfsync everysec",
        'logfile ""',
    ]
    if node.password is not None:
        lines.append(f"requirepass {node.password.get_secret_value()}")
        lines.append(f"masterauth {node.password.get_secret_value()}")
    if node.replica_of is not None:
        lines.append(f"replicaof {node.replica_of[0]} {node.replica_of[1]}")
    return "".join(f"{line}\n" for line in lines)


@dataclass(frozen=True)
class SentinelNode:
    """One Sentinel on loopback watching the primary ``master`` knows as ``name``: with
    ``quorum`` Sentinels agreeing it is down for ``down_after_ms``, they promote a replica."""

    port: int
    home: Path
    name: str
    master: tuple[str, int]
    quorum: int = 2
    down_after_ms: int = 2_000
    failover_timeout_ms: int = 10_000
    host: str = LOOPBACK


def render_sentinel_conf(node: SentinelNode) -> str:
    """sentinel.conf (Sentinel rewrites it as it learns the group, so it lives in ``home``)."""
    host, port = node.master
    lines = [
        f"bind {node.host}",
        f"port {node.port}",
        "daemonize no",
        f'dir "{node.home}"',
        'logfile ""',
        f"sentinel monitor {node.name} {host} {port} {node.quorum}",
        f"sentinel down-after-milliseconds {node.name} {node.down_after_ms}",
        f"sentinel failover-timeout {node.name} {node.failover_timeout_ms}",
        f"sentinel parallel-syncs {node.name} 1",
    ]
    return "".join(f"{line}\n" for line in lines)


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
