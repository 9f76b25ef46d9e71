"""A set of children started in order, supervised, and stopped in reverse order on request
(children started together, the nodes of a cluster, are stopped together)."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Sequence
from types import FrameType

from cli.probes import wait_until
from cli.processes import Child, ChildSpec, stop_together
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
        # In start order; the children of one entry are stopped together.
        self._started: list[list[Child]] = []

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
        self._started.append([child])
        child.start()
        self.supervisor.watch(child)
        if ready is not None:
            wait_until(ready, spec.name, timeout_s, self.stop, died=lambda: death_reason(child))
        return child

    def start_together(self, specs: Sequence[ChildSpec]) -> list[Child]:
        """Starts children that must also stop together (see
        :func:`~cli.processes.stop_together`), each supervised; waits for none of them."""
        children = [Child(spec) for spec in specs]
        self._started.append(children)
        for child in children:
            child.start()
            self.supervisor.watch(child)
        return children

    def supervise(self) -> None:
        """Restarts children that die, until a stop is requested."""
        while not self.stop.is_set():
            self.supervisor.poll()
            self.stop.wait(0.5)

    def stop_all(self) -> None:
        """Stops every child, the last started first."""
        while self._started:
            children = self._started.pop()
            for child in children:
                if child.running():
                    self.report(f"stopping {child.spec.name}")
            stop_together(children)
