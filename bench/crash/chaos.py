"""Process control for the crash test: start, SIGKILL and restart components at random.

Each component runs in its own session (process group) and a kill is ``SIGKILL`` to the whole
group, as when a container dies: the Spark job's JVM goes down with its Python driver. A
component that exits on its own is restarted after a short pause, as a Kubernetes
``restartPolicy: Always`` would, and the exit is recorded; a *oneshot* component (the producer)
that exits 0 has finished and stays down.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import subprocess
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import orjson

from cli.processes import tail

RESTART_PAUSE_S = 0.5
# A node of a domain may go down only once every other node of it has been up this long.
DOMAIN_SETTLE_S = 30.0
# Lines of a component's log kept with each exit of its own, for the report.
EXIT_LOG_LINES = 20


@dataclass(frozen=True, slots=True)
class ComponentSpec:
    """How to run one component. ``chaos``: may be killed; ``min_uptime_s``: not before this;
    ``progress_dir``: nor before a new file appeared there since the component started (it got
    some work done: a slow starter killed every time before its first step would stall the
    run)."""

    name: str
    argv: Sequence[str]
    env: dict[str, str]
    cwd: Path
    log_path: Path
    chaos: bool = True
    min_uptime_s: float = 0.0
    oneshot: bool = False
    progress_dir: Path | None = None
    # Nodes of one replicated service ("kafka"): chaos takes down at most one of them at a
    # time, as the service promises to survive one node lost, not two (see ``peers_settled``).
    domain: str | None = None


@dataclass(frozen=True, slots=True)
class Candidate:
    name: str
    uptime_s: float
    min_uptime_s: float
    kills: int = 0
    progressed: bool = True


def choose_victim(rng: random.Random, candidates: Sequence[Candidate]) -> str | None:
    """A random one of the least-killed candidates that have been up their minimum uptime and
    made progress since they started.

    Least-killed first, so even a short run kills every component, the slow starters too;
    None when no candidate is ready.
    """
    ready = [c for c in candidates if c.uptime_s >= c.min_uptime_s and c.progressed]
    if not ready:
        return None
    fewest = min(c.kills for c in ready)
    return rng.choice([c.name for c in ready if c.kills == fewest])


class EventLog:
    """Kill, restart and exit events, kept in memory and appended to a JSON-lines file."""

    def __init__(self, path: Path | None = None) -> None:
        self.events: list[dict[str, Any]] = []
        self._file: IO[bytes] | None = path.open("ab") if path else None

    def record(self, component: str, action: str, **extra: Any) -> None:
        event = {"t": int(time.time() * 1000), "component": component, "action": action, **extra}
        self.events.append(event)
        if self._file:
            self._file.write(orjson.dumps(event) + b"\n")
            self._file.flush()

    def count(self, action: str, component: str | None = None) -> int:
        return sum(
            1
            for e in self.events
            if e["action"] == action and (component is None or e["component"] == component)
        )

    def exits_on_their_own(self) -> list[dict[str, Any]]:
        """Exits other than the chaos loop's kills and a oneshot finishing: each fails the
        run, with its component, exit code and the end of its log."""
        return [
            {"component": e["component"], "code": e.get("code"), "log": e.get("log", "")}
            for e in self.events
            if e["action"] == "exit" and not e.get("finished")
        ]

    def close(self) -> None:
        if self._file:
            self._file.close()
            self._file = None


@dataclass
class Component:
    """One supervised process."""

    spec: ComponentSpec
    events: EventLog
    process: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    entries_at_start: frozenset[str] = frozenset()
    finished: bool = False
    starts: int = field(default=0)
    # Set while the chaos loop or a fault acts on the component: the supervisor leaves it be
    # (a node a fault killed is not an exit of its own, and the fault restarts it).
    held: bool = False

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def uptime_s(self) -> float:
        return time.monotonic() - self.started_at if self.alive else 0.0

    def progressed(self) -> bool:
        """Whether a new file appeared in ``progress_dir`` since the component last started."""
        if self.spec.progress_dir is None:
            return True
        return not _entries(self.spec.progress_dir) <= self.entries_at_start

    def start(self) -> None:
        if self.alive:
            return
        self.spec.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.spec.log_path.open("ab") as log:
            log.write(f"\n=== start {time.strftime('%H:%M:%S')} ===\n".encode())
            log.flush()
            self.process = subprocess.Popen(
                list(self.spec.argv),
                cwd=self.spec.cwd,
                env=self.spec.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.started_at = time.monotonic()
        if self.spec.progress_dir is not None:
            self.entries_at_start = _entries(self.spec.progress_dir)
        self.starts += 1
        self.finished = False

    @contextlib.contextmanager
    def holding(self) -> Iterator[None]:
        """Keeps the supervisor away while the caller kills and restarts the component."""
        self.held = True
        try:
            yield
        finally:
            self.held = False

    def kill(self) -> None:
        """SIGKILL the component's whole process group and reap it."""
        if self.process is None:
            return
        self._signal_group(signal.SIGKILL)
        self.process.wait()

    def stop(self, timeout_s: float = 10.0) -> int | None:
        """SIGTERM, then SIGKILL after ``timeout_s``; returns the exit code."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self._signal_group(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
        # Children left in the group (a JVM behind a Python driver) go too.
        self._signal_group(signal.SIGKILL)
        return self.process.returncode

    def _signal_group(self, signum: int) -> None:
        assert self.process is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signum)

    def check_exit(self) -> int | None:
        """The exit code if the process ended by itself since the last check, else None."""
        if self.process is None or self.finished or self.process.poll() is None:
            return None
        code = self.process.returncode
        self._signal_group(signal.SIGKILL)
        self.finished = True
        return code


def _entries(folder: Path) -> frozenset[str]:
    try:
        return frozenset(os.listdir(folder))
    except FileNotFoundError:
        return frozenset()


Fault = Callable[[], Awaitable[None]]


class FaultSkipped(Exception):
    """Raised by a fault that cannot be injected now without breaking what the system
    promises to survive (a second node lost while the first has not caught up, say)."""


def peers_settled(components: Sequence[Component], name: str) -> bool:
    """Whether every other node of ``name``'s domain is up, left alone by chaos and faults,
    and has been up :data:`DOMAIN_SETTLE_S`: so a second node is never lost while the first is
    down or has only just come back. True for a component of no domain."""
    me = next(c for c in components if c.name == name)
    if me.spec.domain is None:
        return True
    return all(
        c.alive and not c.held and c.uptime_s() >= DOMAIN_SETTLE_S
        for c in components
        if c.spec.domain == me.spec.domain and c.name != name
    )


class Chaos:
    """Every ``interval_s`` (random in the range), kills a random eligible component and
    restarts it after ``restart_delay_s``, or injects one of the ``faults`` (a node losing its
    memory, say: :mod:`bench.crash.faults`); supervises every component throughout. Kills and
    faults are chosen alike, the least-used first."""

    def __init__(
        self,
        components: Sequence[Component],
        events: EventLog,
        rng: random.Random,
        interval_s: tuple[float, float] = (3.0, 6.0),
        restart_delay_s: tuple[float, float] = (0.0, 1.0),
        faults: Mapping[str, Fault] | None = None,
        settled: Mapping[str, Callable[[], bool]] | None = None,
    ) -> None:
        self.components = list(components)
        self.settled = dict(settled or {})
        self.events = events
        self.rng = rng
        self.interval_s = interval_s
        self.restart_delay_s = restart_delay_s
        self.faults = dict(faults or {})

    async def run(self, stop: asyncio.Event) -> None:
        """Kill and restart until ``stop`` is set; leaves every component running.

        A fault runs beside the loop, one at a time: replacing a node's disk takes a minute
        or more, and kills of Setu's processes go on meanwhile, as they would in a cluster
        (a run whose loop waited for it had a third of its kills)."""
        fault: asyncio.Task[None] | None = None
        try:
            while not stop.is_set():
                fault = await self._turn(stop, fault)
        finally:
            if fault is not None:
                await fault

    async def _turn(
        self, stop: asyncio.Event, fault: asyncio.Task[None] | None
    ) -> asyncio.Task[None] | None:
        """One kill or fault after a random pause; returns the fault running beside."""
        try:
            await asyncio.wait_for(stop.wait(), self.rng.uniform(*self.interval_s))
            return fault
        except TimeoutError:
            pass
        if fault is not None and fault.done():
            fault = None
        candidates = [
            Candidate(
                c.name,
                c.uptime_s(),
                c.spec.min_uptime_s,
                self.events.count("kill", c.name),
                c.progressed(),
            )
            for c in self.components
            if c.spec.chaos and c.alive and not c.held and peers_settled(self.components, c.name)
        ]
        # A fault counts as used when it was tried, injected or not: one that cannot be
        # injected now (say, a replica not in sync) must not take every turn.
        if fault is None:
            candidates += [Candidate(name, 0.0, 0.0, self._tried(name)) for name in self.faults]
        victim = choose_victim(self.rng, candidates)
        domain = self._domain(victim)
        if domain in self.settled and not await asyncio.to_thread(self.settled[domain]):
            others = [c for c in candidates if self._domain(c.name) != domain]
            victim = choose_victim(self.rng, others)
        if victim in self.faults:
            return asyncio.create_task(self.inject(victim))
        if victim is not None:
            await self.kill_and_restart(self._by_name(victim))
        return fault

    async def inject(self, name: str) -> None:
        """Runs one fault; one that fails is recorded as such (and fails the run)."""
        try:
            await self.faults[name]()
        except FaultSkipped as why:
            self.events.record(name, "fault_skipped", why=str(why))
            return
        except Exception as error:
            self.events.record(name, "fault_failed", error=repr(error))
            return
        self.events.record(name, "fault")

    async def kill_and_restart(self, component: Component) -> None:
        with component.holding():
            component.kill()
            self.events.record(
                component.name, "kill", pid=component.process and component.process.pid
            )
            await asyncio.sleep(self.rng.uniform(*self.restart_delay_s))
            component.start()
            self.events.record(component.name, "restart")

    async def supervise(self, stop: asyncio.Event, poll_s: float = 0.2) -> None:
        """Restart components that exit by themselves (a oneshot exiting 0 has finished)."""
        while not stop.is_set():
            for component in self.components:
                if component.held:
                    continue
                code = component.check_exit()
                if code is None:
                    continue
                finished = component.spec.oneshot and code == 0
                # The end of its log says why (a finished producer has nothing to say).
                why = "" if finished else tail(component.spec.log_path, EXIT_LOG_LINES)
                self.events.record(component.name, "exit", code=code, finished=finished, log=why)
                if finished:
                    continue
                await asyncio.sleep(RESTART_PAUSE_S)
                component.start()
                self.events.record(component.name, "restart")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), poll_s)

    def _tried(self, fault: str) -> int:
        return sum(self.events.count(what, fault) for what in ("fault", "fault_skipped"))

    def _domain(self, name: str | None) -> str | None:
        found = next((c for c in self.components if c.name == name), None)
        return found.spec.domain if found is not None else None

    def _by_name(self, name: str) -> Component:
        return next(c for c in self.components if c.name == name)
