"""``setu services``: throwaway Kafka, Redis and PostgreSQL for the test suite.

Each service named by a ``SETU_TEST_*`` variable that is already set is used as it is; the
others are started on free loopback ports with their data in a temporary folder that is
deleted afterwards. ``run`` runs one command with the variables exported and returns its exit
code; ``up`` runs until Ctrl-C.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

from cli.dev_settings import DevSettings
from cli.ports import LOOPBACK
from cli.probes import StopRequested
from cli.services import SETUP_ERRORS, PortPlan, start_kafka, start_postgres, start_redis
from cli.stack import Report, Stack, stop_on_signals
from setu.redact import url_without_password
from setu.settings import Settings

TEST_VARIABLES = {
    "kafka": "SETU_TEST_KAFKA_BOOTSTRAP",
    "redis": "SETU_TEST_REDIS_URL",
    "postgres": "SETU_TEST_DATABASE_URL",
}
# After a stop request the command gets this long to end by itself before SIGTERM.
COMMAND_GRACE_S = 5.0


def missing_services(env: Mapping[str, str]) -> list[str]:
    """The services whose ``SETU_TEST_*`` variable is unset or empty, in start order."""
    return [name for name, variable in TEST_VARIABLES.items() if not env.get(variable)]


def render_env_file(values: Mapping[str, str]) -> str:
    """``NAME=value`` lines a shell can source (``set -a; . file``)."""
    return "".join(f"{name}={shlex.quote(value)}\n" for name, value in sorted(values.items()))


def testbed(
    settings: Settings,
    dev: DevSettings,
    command: Sequence[str],
    env_file: Path | None,
    report: Report,
    host: str = LOOPBACK,
) -> int:
    """Starts what is missing, then runs ``command`` (or waits for a signal); stops it all."""
    stop = threading.Event()
    stop_on_signals(stop)
    workdir = Path(tempfile.mkdtemp(prefix="setu-testbed-"))
    # PostgreSQL runs as its own account when we are root and must reach its folder inside.
    workdir.chmod(0o755)
    stack = Stack(stop, report)
    try:
        values = _start_missing(settings, dev, stack, workdir, host)
        if env_file is not None:
            env_file.write_text(render_env_file(values))
        shown = (f"{k}={url_without_password(v)}" for k, v in sorted(values.items()))
        report("test services: " + ", ".join(shown))
        if not command:
            stack.supervise()
            return 0
        return run_command(command, {**os.environ, **values}, stop)
    except StopRequested:
        return 130
    except SETUP_ERRORS as error:
        report(f"setu services failed: {error}")
        return 1
    finally:
        stack.stop_all()
        shutil.rmtree(workdir, ignore_errors=True)


def _start_missing(
    settings: Settings, dev: DevSettings, stack: Stack, workdir: Path, host: str
) -> dict[str, str]:
    values = {v: os.environ[v] for v in TEST_VARIABLES.values() if os.environ.get(v)}
    ports = PortPlan(explicit={}, remembered={}, defaults={}, chosen={})
    logs = workdir / "logs"
    timeout = dev.ready_timeout_s
    for name in missing_services(os.environ):
        home = workdir / name
        if name == "kafka":
            url = start_kafka(
                stack, settings, home, logs / "kafka.log", ports, dev.kafka_heap, timeout, host
            )
        elif name == "redis":
            url = start_redis(stack, home, logs / "redis.log", ports, timeout, host)
        else:
            url = start_postgres(stack, home, logs / "postgres.log", ports, timeout, host)
        values[TEST_VARIABLES[name]] = url
    return values


def run_command(command: Sequence[str], env: Mapping[str, str], stop: threading.Event) -> int:
    """Runs ``command`` to its end; a stop request ends it (SIGTERM, then SIGKILL)."""
    process = subprocess.Popen(list(command), env=dict(env))
    while process.poll() is None:
        if stop.wait(0.2):
            try:
                return process.wait(timeout=COMMAND_GRACE_S)
            except subprocess.TimeoutExpired:
                process.terminate()
            try:
                return process.wait(timeout=COMMAND_GRACE_S * 2)
            except subprocess.TimeoutExpired:
                process.kill()
                return process.wait()
    return process.returncode
