"""A throwaway PostgreSQL server for tests: Debian's binaries, trust auth, loopback by default.

Durability is switched off (no fsync) because its data is deleted after the run. PostgreSQL
refuses to run as root, so as root it runs as the ``postgres`` account the package creates.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from pydantic import SecretStr

from cli.ports import LOOPBACK
from cli.processes import ChildSpec

DEBIAN_ROOT = Path("/usr/lib/postgresql")
ACCOUNT = "postgres"
# A server with a password (one on another address than loopback, serving containers on this
# machine: tests/install) also lets in clients on the networks the machine is attached to, such
# as a container bridge, looked up at each connection, once they show the password.
SAME_NETWORK_HBA = "host all all samenet scram-sha-256\n"


class PostgresUnavailable(Exception):
    """Raised when PostgreSQL's server binaries are missing or initdb fails."""


def newest_bin_dir(candidates: Iterable[Path]) -> Path | None:
    """Of ``.../<major>/bin`` folders that hold ``initdb``, the one with the highest major."""
    usable = [c for c in candidates if (c / "initdb").exists() and c.parent.name.isdigit()]
    if not usable:
        return None
    return max(usable, key=lambda c: int(c.parent.name))


@dataclass(frozen=True)
class PostgresNode:
    """Where one throwaway server listens and keeps its cluster."""

    port: int
    home: Path
    host: str = LOOPBACK
    password: SecretStr | None = None

    @property
    def cluster_dir(self) -> Path:
        return self.home / "cluster"

    @property
    def url(self) -> str:
        login = ACCOUNT
        if self.password is not None:
            login += f":{self.password.get_secret_value()}"
        return f"postgresql+psycopg://{login}@{self.host}:{self.port}/postgres"


def initdb_command(bin_dir: Path, node: PostgresNode, pwfile: Path | None = None) -> list[str]:
    return [
        str(bin_dir / "initdb"),
        "--pgdata",
        str(node.cluster_dir),
        "--username",
        ACCOUNT,
        "--auth",
        "trust",
        "--encoding",
        "UTF8",
        "--locale",
        "C",
        "--no-sync",
        *(["--pwfile", str(pwfile)] if pwfile is not None else []),
    ]


def server_command(bin_dir: Path, node: PostgresNode) -> list[str]:
    settings = {
        "listen_addresses": node.host,
        "unix_socket_directories": str(node.home),
        "fsync": "off",
        "synchronous_commit": "off",
        "full_page_writes": "off",
        "max_connections": "200",
    }
    argv = [str(bin_dir / "postgres"), "-D", str(node.cluster_dir), "-p", str(node.port)]
    for key, value in settings.items():
        argv += ["-c", f"{key}={value}"]
    return argv


def ready_command(bin_dir: Path, node: PostgresNode) -> list[str]:
    return [str(bin_dir / "pg_isready"), "-q", "-h", node.host, "-p", str(node.port)]


class LocalPostgres:
    """A server whose cluster lives in ``node.home`` (created by :meth:`prepare`)."""

    def __init__(self, node: PostgresNode, log_path: Path) -> None:
        self.node = node
        self.log_path = log_path
        found = newest_bin_dir(DEBIAN_ROOT.glob("*/bin"))
        if found is None:
            raise PostgresUnavailable(
                f"no PostgreSQL server under {DEBIAN_ROOT}: run scripts/install"
            )
        self.bin_dir = found
        self.run_as = ACCOUNT if os.geteuid() == 0 else None

    def prepare(self) -> None:
        """Creates the cluster if it does not exist. Raises PostgresUnavailable."""
        self.node.home.mkdir(parents=True, exist_ok=True)
        account = pwd.getpwnam(self.run_as) if self.run_as is not None else None
        if account is not None:
            shutil.chown(self.node.home, account.pw_uid, account.pw_gid)
        if (self.node.cluster_dir / "PG_VERSION").exists():
            return
        pwfile = None
        if self.node.password is not None:
            pwfile = self.node.home / "pwfile"
            pwfile.touch(mode=0o600)
            pwfile.write_text(self.node.password.get_secret_value())
            if account is not None:
                shutil.chown(pwfile, account.pw_uid, account.pw_gid)
        try:
            self._initdb(pwfile)
        finally:
            if pwfile is not None:
                pwfile.unlink()
        if self.node.password is not None:
            with (self.node.cluster_dir / "pg_hba.conf").open("a") as hba:
                hba.write(SAME_NETWORK_HBA)

    def _initdb(self, pwfile: Path | None) -> None:
        result = subprocess.run(
            initdb_command(self.bin_dir, self.node, pwfile),
            capture_output=True,
            text=True,
            check=False,
            stdin=subprocess.DEVNULL,
            cwd=self.node.home,
            user=self.run_as,
            group=self.run_as,
            extra_groups=[] if self.run_as else None,
        )
        if result.returncode != 0:
            raise PostgresUnavailable(f"initdb failed:\n{result.stdout}{result.stderr}")

    def child_spec(self) -> ChildSpec:
        # SIGINT is PostgreSQL's "fast shutdown": no waiting for clients to disconnect.
        return ChildSpec(
            name="postgres",
            argv=tuple(server_command(self.bin_dir, self.node)),
            log_path=self.log_path,
            cwd=self.node.home,
            run_as=self.run_as,
            stop_signal=signal.SIGINT,
        )

    def answers(self) -> bool:
        """True when the server accepts connections."""
        result = subprocess.run(
            ready_command(self.bin_dir, self.node),
            check=False,
            stdin=subprocess.DEVNULL,
            capture_output=True,
        )
        return result.returncode == 0
