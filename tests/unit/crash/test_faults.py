"""The broker-wipe fault's choices (bench/crash/faults.py), on a stand-in cluster: it never
takes a second copy away while one is missing."""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from bench.crash import faults
from bench.crash.chaos import Chaos, Component, ComponentSpec, EventLog, FaultSkipped
from bench.crash.faults import BrokerWipe
from cli.kafka_local import KafkaUnavailable


@dataclass
class Node:
    node_id: int


@dataclass
class Cluster:
    """What the fault asks of cli.kafka_cluster.LocalKafkaCluster."""

    refuse: bool = False
    wipe_s: float = 0.0
    catching_up: list[str] = field(default_factory=list)
    looks: list[int] = field(default_factory=list)
    nodes: tuple[Node, ...] = (Node(1), Node(2), Node(3))
    wiped: list[int] = field(default_factory=list)
    joined: list[int] = field(default_factory=list)

    def replace_disk(self, node_id: int) -> None:
        if self.refuse:
            raise KafkaUnavailable("no other node holds these partitions in sync")
        time.sleep(self.wipe_s)
        self.wiped.append(node_id)

    def lagging(self) -> list[str]:
        return self.catching_up

    def listed_in_sync(self, node_id: int) -> bool:
        # Fenced at the second look, as the controller does after its session timeout
        self.looks.append(node_id)
        return self.looks.count(node_id) < 2

    def join_quorum(self, node_id: int, timeout_s: float) -> None:
        self.joined.append(node_id)


@pytest.fixture(autouse=True)
def settle_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nodes count as settled as soon as they run (the run waits 30 s)."""
    monkeypatch.setattr(faults, "DOMAIN_SETTLE_S", 0.0)


def nodes(tmp_path: Path, events: EventLog) -> dict[str, Component]:
    out = {}
    for n in (1, 2, 3):
        spec = ComponentSpec(
            f"kafka-{n}", ["sleep", "60"], {}, tmp_path, tmp_path / f"kafka-{n}.log"
        )
        component = Component(spec, events)
        component.start()
        out[spec.name] = component
    return out


async def test_a_node_loses_its_disk_and_joins_again(tmp_path: Path) -> None:
    events = EventLog()
    components = nodes(tmp_path, events)
    cluster = Cluster()
    try:
        await BrokerWipe(cluster, components, random.Random(3))()
        # One node was killed, fenced, given an empty disk, started and made a voter again
        assert len(cluster.wiped) == 1 and cluster.joined == cluster.wiped
        assert cluster.looks == cluster.wiped * 2
        assert all(c.alive for c in components.values())
        assert events.count("kill") == 1
    finally:
        for c in components.values():
            c.kill()


@pytest.mark.parametrize("reason", ["node down", "just back", "not in sync", "catching up"])
async def test_no_second_copy_is_taken_while_one_is_missing(
    tmp_path: Path, reason: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if reason == "just back":
        # A node restarted a moment ago may not be listed out of sync yet
        monkeypatch.setattr(faults, "DOMAIN_SETTLE_S", 60.0)
    events = EventLog()
    components = nodes(tmp_path, events)
    cluster = Cluster(refuse=reason == "not in sync")
    if reason == "catching up":
        # A node killed or wiped a moment ago is still copying what it missed
        cluster.catching_up = ["setu.p.t.main-0"]
    if reason == "node down":
        components["kafka-2"].kill()
    try:
        with pytest.raises(FaultSkipped):
            await BrokerWipe(cluster, components, random.Random(3))()
        # Nothing lost its disk, and a node killed to try is running again
        assert cluster.wiped == []
        assert sum(c.alive for c in components.values()) == (2 if reason == "node down" else 3)
        assert events.count("kill") == (1 if reason == "not in sync" else 0)
    finally:
        for c in components.values():
            c.kill()


async def test_the_supervisor_leaves_a_node_alone_while_it_loses_its_disk(tmp_path: Path) -> None:
    # The supervisor restarts components that exit on their own. A node the fault killed is
    # not one: restarting it while its disk is being replaced would start it on a half-made
    # folder and record an exit that fails the run.
    events = EventLog()
    components = nodes(tmp_path, events)
    cluster = Cluster(wipe_s=0.6)
    chaos = Chaos(list(components.values()), events, random.Random(1))
    stop = asyncio.Event()
    supervisor = asyncio.create_task(chaos.supervise(stop, poll_s=0.02))
    try:
        await BrokerWipe(cluster, components, random.Random(3))()
        stop.set()
        await supervisor
        [wiped] = cluster.wiped
        assert events.exits_on_their_own() == []
        assert components[f"kafka-{wiped}"].starts == 2
        assert events.count("restart") == 1
    finally:
        stop.set()
        for c in components.values():
            c.kill()
