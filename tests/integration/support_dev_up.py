"""`setu dev up` run from the tests: a whole stack on ports of their own, its output read line
by line, killed if a test leaves it running."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from cli.ports import free_ports

START_TIMEOUT_S = 240.0
STOP_TIMEOUT_S = 120.0


class DevUp:
    """A running `setu dev up` whose output is read line by line."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.process = process
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def wait_for_line(self, pattern: str, timeout_s: float) -> re.Match[str]:
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"no line matching {pattern!r}; output:\n" + "\n".join(self.seen)
            try:
                line = self.lines.get(timeout=remaining)
            except queue.Empty:
                continue
            assert line is not None, "dev up ended; output:\n" + "\n".join(self.seen)
            self.seen.append(line)
            match = re.search(pattern, line)
            if match:
                return match

    def stop(self) -> int:
        self.process.send_signal(signal.SIGINT)
        code = self.process.wait(timeout=STOP_TIMEOUT_S)
        while (line := self.lines.get(timeout=5)) is not None:
            self.seen.append(line)
        return code


def stack_ports() -> dict[str, int]:
    """A free port for each listener of :func:`dev_up`'s stack, all different."""
    names = ("api", "stream", "kafka", "controller", "redis", "spark", "spark_ui")
    return dict(zip(names, free_ports(len(names)), strict=True))


@contextmanager
def dev_up(
    data_dir: Path, ports: dict[str, int], *options: str, env: dict[str, str] | None = None
) -> Iterator[DevUp]:
    """``setu dev up *options`` on ``ports``, with ``env`` beside this process's own."""
    extra = env or {}
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("SETU_KAFKA_BOOTSTRAP", "SETU_REDIS_URL", "SETU_DATABASE_URL")
    }
    env.update(
        SETU_DATA_DIR=str(data_dir),
        SETU_API_PORT=str(ports["api"]),
        SETU_STREAM_PORT=str(ports["stream"]),
        SETU_DEV_KAFKA_PORT=str(ports["kafka"]),
        SETU_DEV_KAFKA_CONTROLLER_PORT=str(ports["controller"]),
        SETU_DEV_REDIS_PORT=str(ports["redis"]),
        SETU_DEV_SPARK_MASTER_PORT=str(ports["spark"]),
        SETU_DEV_SPARK_UI_PORT=str(ports["spark_ui"]),
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    process = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "dev", "up", *options],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    running = DevUp(process)
    try:
        yield running
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
