"""Chaos: victim choice, and process control against real (tiny) processes."""

from __future__ import annotations

import asyncio
import os
import random
import sys
import time
from pathlib import Path

import pytest

from bench.crash import chaos as chaos_module
from bench.crash.chaos import (
    Candidate,
    Chaos,
    Component,
    ComponentSpec,
    EventLog,
    FaultSkipped,
    choose_victim,
    peers_settled,
)
from tests.waiting import wait_for


@pytest.mark.parametrize(
    ("candidates", "allowed"),
    [
        ([], set()),
        ([Candidate("spark", 5.0, 20.0)], set()),
        ([Candidate("spark", 5.0, 20.0), Candidate("api", 0.1, 0.0)], {"api"}),
        ([Candidate("spark", 25.0, 20.0), Candidate("api", 1.0, 0.0)], {"api", "spark"}),
        # the least-killed ready components go first
        (
            [
                Candidate("spark", 25.0, 20.0, kills=1),
                Candidate("api", 1.0, 0.0, kills=3),
                Candidate("worker", 1.0, 0.0, kills=1),
                Candidate("redis", 1.0, 5.0, kills=0),
            ],
            {"spark", "worker"},
        ),
        # up long enough but no progress since its restart: spared
        (
            [Candidate("spark", 60.0, 20.0, progressed=False), Candidate("api", 1.0, 0.0)],
            {"api"},
        ),
    ],
)
def test_only_components_up_long_enough_are_chosen(
    candidates: list[Candidate], allowed: set[str]
) -> None:
    rng = random.Random(0)
    chosen: set[str | None] = {choose_victim(rng, candidates) for _ in range(50)}
    expected: set[str | None] = set(allowed) if allowed else {None}
    assert chosen == expected


def spec(tmp_path: Path, name: str, code: str, **options: object) -> ComponentSpec:
    return ComponentSpec(
        name=name,
        argv=[sys.executable, "-c", code],
        env=dict(os.environ),
        cwd=tmp_path,
        log_path=tmp_path / f"{name}.log",
        **options,  # type: ignore[arg-type]
    )


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


# Starts a child that writes its pid to a file, then both sleep: a driver with its JVM.
PARENT_WITH_CHILD = (
    "import subprocess, sys, time\n"
    "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
    "open('child.pid', 'w').write(str(child.pid))\n"
    "print('up', flush=True)\n"
    "time.sleep(60)\n"
)


def test_kill_takes_down_the_whole_process_group(tmp_path: Path) -> None:
    # Given a component whose process started a child
    component = Component(spec(tmp_path, "spark", PARENT_WITH_CHILD), EventLog())
    component.start()
    wait_for(
        "the child pid",
        lambda: (tmp_path / "child.pid").exists() and (tmp_path / "child.pid").read_text(),
        5,
    )
    child = int((tmp_path / "child.pid").read_text())
    # When it is killed
    component.kill()
    # Then the child is gone too
    assert not component.alive
    wait_for("the child gone", lambda: not pid_alive(child), 5)
    assert "up" in (tmp_path / "spark.log").read_text()


def test_stop_escalates_to_sigkill(tmp_path: Path) -> None:
    code = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(60)"
    component = Component(spec(tmp_path, "stubborn", code), EventLog())
    component.start()
    time.sleep(0.3)
    assert component.stop(timeout_s=0.5) == -9


async def test_chaos_kills_and_restarts_until_stopped(tmp_path: Path) -> None:
    # Given two long-running components
    events = EventLog(tmp_path / "events.log")
    components = [
        Component(spec(tmp_path, name, "import time; time.sleep(60)"), events)
        for name in ("api", "worker")
    ]
    for component in components:
        component.start()
    chaos = Chaos(components, events, random.Random(1), (0.05, 0.1), (0.0, 0.05))
    # When chaos runs for a while
    await run_for(chaos, 1.0)
    # Then it killed and restarted several times, and left everything running
    kills = events.count("kill")
    assert kills >= 4
    assert events.count("restart") == kills
    assert all(c.alive for c in components)
    assert sum(c.starts for c in components) == 2 + kills
    assert (tmp_path / "events.log").read_bytes().count(b"\n") == 2 * kills
    for component in components:
        component.stop()
    events.close()


async def run_for(chaos: Chaos, seconds: float) -> None:
    """Runs the chaos loop for ``seconds``, then stops it and waits for it to end."""
    stop = asyncio.Event()
    task = asyncio.create_task(chaos.run(stop))
    await asyncio.sleep(seconds)
    stop.set()
    await task


def _started(tmp_path: Path, events: EventLog, *names: str) -> list[Component]:
    """:func:`_nodes`, each started."""
    components = _nodes(tmp_path, events, *names)
    for component in components:
        component.start()
    return components


def _nodes(
    tmp_path: Path, events: EventLog, *names: str, min_uptime_s: float = 0.0
) -> list[Component]:
    """Long-running components; ``kafka-*`` ones form the domain "kafka"."""
    return [
        Component(
            spec(
                tmp_path,
                name,
                "import time; time.sleep(60)",
                domain="kafka" if name.startswith("kafka") else None,
                min_uptime_s=min_uptime_s,
            ),
            events,
        )
        for name in names
    ]


def test_a_node_may_go_down_only_while_its_peers_are_up_settled_and_left_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(chaos_module, "DOMAIN_SETTLE_S", 0.3)
    components = _nodes(tmp_path, EventLog(), "kafka-1", "kafka-2", "api")
    _, kafka_2, _ = components
    for component in components:
        component.start()
    try:
        # peers just started: not settled; a component of no domain always may go
        assert not peers_settled(components, "kafka-1")
        assert peers_settled(components, "api")
        wait_for("kafka-1's peers settled", lambda: peers_settled(components, "kafka-1"), 10)
        # a peer a fault holds, or a peer down, is not settled
        with kafka_2.holding():
            assert not peers_settled(components, "kafka-1")
        kafka_2.kill()
        assert not peers_settled(components, "kafka-1")
        assert peers_settled(components, "kafka-2")  # its peer kafka-1 is up and settled
    finally:
        for component in components:
            component.stop()


async def test_chaos_spares_a_domain_that_has_not_settled_and_goes_on_with_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a two-node domain whose service says it is not in sync, and an API
    monkeypatch.setattr(chaos_module, "DOMAIN_SETTLE_S", 0.0)
    events = EventLog()
    components = _nodes(tmp_path, events, "kafka-1", "kafka-2", "api")
    for component in components:
        component.start()
    checks: list[bool] = []

    def settled() -> bool:
        checks.append(False)
        return False

    chaos = Chaos(
        components, events, random.Random(3), (0.02, 0.05), (0.0, 0.02), settled={"kafka": settled}
    )
    # When chaos runs for a while
    await run_for(chaos, 1.0)
    # Then it asked the service, killed no node of it, and kept killing the API meanwhile
    assert checks
    assert events.count("kill", "kafka-1") == events.count("kill", "kafka-2") == 0
    assert events.count("kill", "api") >= 4
    for component in components:
        component.stop()


async def test_chaos_never_has_two_nodes_of_a_domain_down_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a three-node domain whose nodes must be up 0.2 s before a peer may go down (and
    # before they go down again themselves)
    monkeypatch.setattr(chaos_module, "DOMAIN_SETTLE_S", 0.2)
    events = EventLog()
    components = _nodes(tmp_path, events, "kafka-1", "kafka-2", "kafka-3", min_uptime_s=0.2)
    for component in components:
        component.start()
    await asyncio.sleep(0.25)
    chaos = Chaos(
        components,
        events,
        random.Random(5),
        (0.01, 0.03),
        (0.0, 0.05),
        settled={"kafka": lambda: True},
    )
    # When chaos runs for a while, killing as often as it may
    await run_for(chaos, 1.5)
    # Then it killed several times, each kill at least 0.2 s after any other node came back
    kills = [e for e in events.events if e["action"] == "kill"]
    assert len({e["component"] for e in kills}) >= 2
    restarts = [e for e in events.events if e["action"] == "restart"]
    for kill in kills:
        peers_back = [
            e["t"] for e in restarts if e["t"] <= kill["t"] and e["component"] != kill["component"]
        ]
        assert not peers_back or kill["t"] - max(peers_back) >= 200
    for component in components:
        component.stop()


async def test_supervisor_restarts_crashed_components_but_not_finished_oneshots(
    tmp_path: Path,
) -> None:
    # Given a component that crashes at once and a oneshot that finishes at once
    events = EventLog()
    crashing = Component(
        spec(tmp_path, "api", "print('the reason', flush=True); raise SystemExit(2)"), events
    )
    oneshot = Component(spec(tmp_path, "producer", "pass", oneshot=True), events)
    crashing.start()
    oneshot.start()
    chaos = Chaos([crashing, oneshot], events, random.Random(1))
    stop = asyncio.Event()
    task = asyncio.create_task(chaos.supervise(stop, poll_s=0.05))
    await asyncio.sleep(1.5)
    stop.set()
    await task
    # Then the crashing one was restarted each time, the oneshot never
    assert events.count("exit", "api") >= 2
    assert events.count("restart", "api") >= 2
    producer_events = [e for e in events.events if e["component"] == "producer"]
    assert [(e["action"], e["code"]) for e in producer_events] == [("exit", 0)]
    assert producer_events[0]["finished"] is True
    assert oneshot.starts == 1
    # And each crash is kept with the end of the component's log, for the report
    exits = events.exits_on_their_own()
    assert {e["component"] for e in exits} == {"api"}
    assert exits[0]["code"] == 2
    assert "the reason" in exits[0]["log"]
    crashing.stop()


def test_a_component_has_progressed_once_a_new_file_appears_in_its_progress_folder(
    tmp_path: Path,
) -> None:
    # Given a component whose progress folder holds a file from before its start
    commits = tmp_path / "commits"
    commits.mkdir()
    (commits / "0").write_text("")
    component = Component(
        spec(tmp_path, "job", "import time; time.sleep(30)", progress_dir=commits), EventLog()
    )
    component.start()
    try:
        # Then it has not progressed yet
        assert not component.progressed()
        # When it writes a new file there
        (commits / "1").write_text("")
        # Then it has
        assert component.progressed()
    finally:
        component.kill()


def test_a_component_whose_progress_folder_does_not_exist_yet_has_not_progressed(
    tmp_path: Path,
) -> None:
    component = Component(
        spec(tmp_path, "job", "pass", progress_dir=tmp_path / "missing"), EventLog()
    )
    assert not component.progressed()


async def test_a_fault_that_cannot_be_injected_now_does_not_take_every_turn(
    tmp_path: Path,
) -> None:
    # Given an API, a worker and a fault that is always skipped (say, a replica never in sync)
    events = EventLog()
    components = _started(tmp_path, events, "api", "worker")

    async def never_now() -> None:
        raise FaultSkipped("the replica is not in sync")

    chaos = Chaos(
        components, events, random.Random(2), (0.02, 0.05), (0.0, 0.02), faults={"f": never_now}
    )
    # When chaos runs for a while
    await run_for(chaos, 1.0)
    # Then the fault was tried about as often as each component was killed, not on every turn
    tried, kills = events.count("fault_skipped", "f"), events.count("kill")
    assert tried >= 2 and kills >= 2 * tried - 2
    for component in components:
        component.stop()


async def test_kills_go_on_while_a_slow_fault_runs_and_the_fault_ends_before_the_loop(
    tmp_path: Path,
) -> None:
    # Given an API, a worker and a fault that takes a while (a node's disk being replaced)
    events = EventLog()
    components = _started(tmp_path, events, "api", "worker")
    seen: dict[str, int] = {}
    release = asyncio.Event()

    async def slow() -> None:
        seen["kills_at_start"] = events.count("kill")
        await release.wait()
        seen["kills_at_end"] = events.count("kill")

    chaos = Chaos(
        components, events, random.Random(3), (0.02, 0.05), (0.0, 0.02), faults={"f": slow}
    )
    stop = asyncio.Event()
    task = asyncio.create_task(chaos.run(stop))
    # When chaos runs while the fault is under way
    await asyncio.sleep(1.0)
    stop.set()
    await asyncio.sleep(0.2)
    # Then the loop waits for the fault to end before it ends
    assert not task.done()
    release.set()
    await task
    # And the components were killed meanwhile, and the fault ran once (never twice at once)
    assert seen["kills_at_end"] - seen["kills_at_start"] >= 5
    assert events.count("fault", "f") == 1
    for component in components:
        component.stop()
