"""A set of children started in order, supervised, and stopped in reverse order on request."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType

from cli.probes import wait_until
from cli.processes import Child, ChildSpec
from cli.supervisor import Supervisor

Report = Callable[[str], None]


def stop_on_signals(stop: threading.Event) -> None:
    """Makes Ctrl-C, SIGTERM and SIGHUP set ``stop`` instead of interrupting the program."""

    def handle(signum: int, frame: FrameType | None) -> None:
        stop.set()

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, handle)


def death_reason(child: Child) -> str | None:
    """Why a child we are waiting for will never answer: it exited (with its last log lines)."""
    code = child.exit_code()
    if code is None:
        return None
    return (
        f"{child.spec.name} exited with code {code}; last lines of {child.spec.log_path}:\n"
        f"{child.log_tail()}"
    )


class Stack:
    """Children that are stopped together, the last started first."""

    def __init__(self, stop: threading.Event, report: Report) -> None:
        self.stop = stop
        self.report = report
        self.supervisor = Supervisor(report)
        self._children: list[Child] = []

    def start(
        self,
        spec: ChildSpec,
        ready: Callable[[], bool] | None = None,
        timeout_s: float = 60.0,
    ) -> Child:
        """Starts a child and, given ``ready``, waits for it to answer.

        Raises NotReady if it exits or stays silent past ``timeout_s``, and StopRequested if a
        stop is requested meanwhile. Either way the child stays supervised and is stopped with
        the rest.
        """
        child = Child(spec)
        self._children.append(child)
        child.start()
        self.supervisor.watch(child)
        if ready is not None:
            wait_until(ready, spec.name, timeout_s, self.stop, died=lambda: death_reason(child))
        return child

    def supervise(self) -> None:
        """Restarts children that die, until a stop is requested."""
        while not self.stop.is_set():
            self.supervisor.poll()
            self.stop.wait(0.5)

    def stop_all(self) -> None:
        """Stops every child, the last started first."""
        while self._children:
            child = self._children.pop()
            if child.running():
                self.report(f"stopping {child.spec.name}")
            child.stop()
