"""Child processes with their output in a log file, each in its own process group.

Own process groups keep a terminal's Ctrl-C away from the children, so the parent stops them in
its chosen order; stopping a child signals its whole group (pyspark's JVM, for instance).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import pwd
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

# A `setu` sub-command exits with this when the module it runs is not installed.
EXIT_NOT_AVAILABLE = 3

_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class ChildSpec:
    """How to run one child: what, where its output goes, and how to stop it."""

    name: str
    argv: tuple[str, ...]
    log_path: Path
    env: Mapping[str, str] | None = None
    cwd: Path | None = None
    run_as: str | None = None
    stop_signal: signal.Signals = signal.SIGTERM
    stop_timeout_s: float = 20.0
    # The stop signal to the child alone, not its process group: for a child that stops what
    # it started itself (the ingest job stops Spark's JVM; signalled at once, the JVM would die
    # under the job's feet). What is left of the group when the child ended is killed.
    signal_leader_only: bool = False


def _die_with_parent() -> None:
    # Children must not outlive a parent that was killed without a chance to stop them.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class Child:
    """One running (or stopped) child process."""

    def __init__(self, spec: ChildSpec) -> None:
        self.spec = spec
        self._process: subprocess.Popen[bytes] | None = None
        self._signalled = False  # its stop signal was sent since it started
        self.started_at = 0.0

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    def start(self) -> None:
        """Starts the child, appending its output to its log file."""
        spec = self.spec
        spec.log_path.parent.mkdir(parents=True, exist_ok=True)
        with spec.log_path.open("ab") as log:
            stamp = time.strftime("%Y-%m-%d %H:%M:%S")
            log.write(f"==== {stamp} starting {spec.name}: {' '.join(spec.argv)}\n".encode())
            log.flush()
            uid: int | None = None
            gid: int | None = None
            extra_groups: list[int] | None = None
            if spec.run_as is not None and os.geteuid() == 0:
                account = pwd.getpwnam(spec.run_as)
                uid, gid, extra_groups = account.pw_uid, account.pw_gid, []
            self._process = subprocess.Popen(
                spec.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=dict(spec.env) if spec.env is not None else None,
                cwd=spec.cwd,
                start_new_session=True,
                preexec_fn=_die_with_parent if sys.platform == "linux" else None,
                user=uid,
                group=gid,
                extra_groups=extra_groups,
            )
        self._signalled = False
        self.started_at = time.monotonic()

    def exit_code(self) -> int | None:
        """The exit code once the child has ended, None while it runs (or never started)."""
        return self._process.poll() if self._process else None

    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def ran_for(self) -> float:
        return time.monotonic() - self.started_at

    def signal_stop(self) -> None:
        """Sends the spec's stop signal to the child's process group (or the child alone, see
        ``ChildSpec.signal_leader_only``), without waiting."""
        process = self._process
        if process is None or process.poll() is not None:
            return
        self._signalled = True
        if self.spec.signal_leader_only:
            process.send_signal(self.spec.stop_signal)
        else:
            _signal_group(process.pid, self.spec.stop_signal)

    def stop(self) -> int | None:
        """Stops the child and everything in its process group; returns its exit code.

        Sends the spec's stop signal (once: a child already signalled by :meth:`signal_stop`
        is not signalled again, as a second signal may end a clean stop halfway), waits up to
        its timeout, then kills the group.
        """
        process = self._process
        if process is None:
            return None
        group = process.pid
        deadline = time.monotonic() + self.spec.stop_timeout_s
        if not self._signalled:
            self.signal_stop()
        try:
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal_group(group, signal.SIGKILL)
            process.wait()
        # The leader is gone; give what it left in its group the rest of the time, then kill it.
        while _group_alive(group) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _group_alive(group):
            _signal_group(group, signal.SIGKILL)
        return process.returncode

    def log_tail(self, lines: int = 8) -> str:
        return tail(self.spec.log_path, lines)


def stop_together(children: Sequence[Child]) -> None:
    """Stops ``children`` at the same time: each gets its stop signal before any is waited
    for, then each is stopped as by :meth:`Child.stop`. For the nodes of a cluster, whose last
    one could not stop alone (it would wait for a quorum that left before it)."""
    for child in children:
        child.signal_stop()
    for child in children:
        child.stop()


def _signal_group(group: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(group, signum)


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def tail(path: Path, lines: int) -> str:
    """The last ``lines`` lines of a text file ("" if it does not exist)."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            text = f.read().decode(errors="replace")
    except FileNotFoundError:
        return ""
    return "\n".join(text.splitlines()[-lines:])
