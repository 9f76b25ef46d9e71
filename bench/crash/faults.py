"""Faults beyond a process kill, for the crash test's chaos loop: nodes that lose what they
held, as real clusters do and a SIGKILL on one machine does not (the kernel keeps a killed
process's writes).

- ``redis-flush``: Redis forgets everything (``FLUSHALL``), as after a failover to a replica
  that had nothing, or a restore of an empty backup.
- ``redis-rollback``: Redis (the primary) restarts from an older copy of its data folder, so
  it lacks its latest writes (a backup restored). The copy is the one the previous rollback
  took (the first takes one and rolls nothing back).
- ``redis-failover`` (Redis with a replica and Sentinel): the primary is SIGKILLed, Sentinel
  promotes the replica, which may lack the primary's last writes (replication is
  asynchronous), and the old primary comes back as a replica of the new one. Skipped while the
  replica is not in sync, since then there is nothing to fail over to.
- ``broker-wipe`` (a three-node cluster): one Kafka node is SIGKILLed, loses its data folder,
  and comes back with an empty disk, formatted to join again, then is made a voter of the
  quorum again (``cli/kafka_cluster.py``). Skipped while any replica is out of sync (a node
  still catching up after a kill or an earlier wipe), since losing a second copy is more than
  replication factor 3 with two in sync promises to survive.
- ``receiver`` is killed like any component when the run allows it (its journal survives).

Setu must lose nothing and reorder nothing through them (docs/design.md §4).
"""

from __future__ import annotations

import asyncio
import random
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import redis
import redis.asyncio as aioredis

from bench.crash.brokers import RedisNodes
from bench.crash.chaos import DOMAIN_SETTLE_S, Component, FaultSkipped


async def redis_flush(url: Callable[[], str]) -> None:
    """``FLUSHALL`` on the Redis ``url()`` names when called (the primary of the moment)."""
    client = aioredis.Redis.from_url(await asyncio.to_thread(url), socket_timeout=10)
    try:
        await client.flushall()
    finally:
        await client.aclose()  # type: ignore[attr-defined]  # types-redis predates aclose


class RedisRollback:
    """Restarts the primary from the copy of its data folder taken at the previous call."""

    def __init__(
        self, nodes: RedisNodes, components: Mapping[str, Component], ready: Callable[[], bool]
    ) -> None:
        self._nodes = nodes
        self._components = components
        self._ready = ready
        self._copy: tuple[str, Path] | None = None  # (the server it was taken of, where)

    async def __call__(self) -> None:
        name = await asyncio.to_thread(self._nodes.primary)
        component = self._components[name]
        data = self._nodes.data[name]
        if self._copy is not None and self._copy[0] == name:
            with component.holding():
                component.kill()
                shutil.rmtree(data)
                shutil.copytree(self._copy[1], data)
                component.start()
            component.events.record(component.name, "restart", older=True)
            await _await(self._ready, 60.0)
        # The next rollback goes back to now (a live copy: Redis loads a torn AOF tail).
        copy = data.parent / "older-copy"
        shutil.rmtree(copy, ignore_errors=True)
        await asyncio.to_thread(shutil.copytree, data, copy)
        self._copy = (name, copy)


class RedisFailover:
    """Kills the primary and waits for Sentinel to promote the replica (see the module doc)."""

    def __init__(self, nodes: RedisNodes, components: Mapping[str, Component]) -> None:
        self._nodes = nodes
        self._components = components

    async def __call__(self) -> None:
        old = await asyncio.to_thread(self._nodes.primary)
        if not await asyncio.to_thread(_replica_in_sync, self._nodes.urls[old]):
            raise FaultSkipped("the replica is not in sync")
        component = self._components[old]
        with component.holding():
            component.kill()
            component.events.record(component.name, "kill", failover=True)
            try:
                promoted = await _await(lambda: self._promoted(old), FAILOVER_TIMEOUT_S)
            finally:
                # Back, and made a replica of the new primary by Sentinel
                component.start()
        component.events.record(component.name, "restart")
        if not promoted:
            raise TimeoutError(f"Sentinel did not promote a replica in {FAILOVER_TIMEOUT_S} s")

    def _promoted(self, old: str) -> bool:
        try:
            return self._nodes.primary() != old
        except redis.RedisError:
            return False


FAILOVER_TIMEOUT_S = 60.0
# How long a killed Kafka node may stay listed in sync before its wipe is given up.
FENCE_TIMEOUT_S = 120.0


def _replica_in_sync(primary_url: str) -> bool:
    """Whether the primary has a replica online (Redis's INFO replication)."""
    client = redis.Redis.from_url(primary_url, socket_timeout=2)
    try:
        info = client.info("replication")
    except redis.RedisError:
        return False
    finally:
        client.close()
    return any(
        isinstance(value, dict) and value.get("state") == "online"
        for key, value in info.items()
        if str(key).startswith("slave")
    )


async def _await(ready: Callable[[], bool], timeout_s: float) -> bool:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await asyncio.to_thread(ready):
        if asyncio.get_running_loop().time() > deadline:
            return False
        await asyncio.sleep(0.1)
    return True


class BrokerWipe:
    """A random live Kafka node of the run's cluster loses its disk (see the module doc)."""

    def __init__(
        self, cluster: Any, components: Mapping[str, Component], rng: random.Random
    ) -> None:
        self._cluster = cluster
        self._components = components
        self._rng = rng

    async def __call__(self) -> None:
        from cli.kafka_local import KafkaUnavailable

        alive = [
            node.node_id
            for node in self._cluster.nodes
            if (c := self._components.get(f"kafka-{node.node_id}")) is not None
            and c.alive
            and not c.held
            and c.uptime_s() >= DOMAIN_SETTLE_S
        ]
        if len(alive) < len(self._cluster.nodes):
            raise FaultSkipped("a node is down or has only just come back")
        # Every copy in sync first: a node still catching up after a kill or an earlier
        # wipe holds less than it will, and losing a second disk now would be two nodes lost.
        lagging = await asyncio.to_thread(self._cluster.lagging)
        if lagging:
            raise FaultSkipped(f"a node is catching up: {', '.join(lagging[:5])}")
        node_id = self._rng.choice(alive)
        component = self._components[f"kafka-{node_id}"]
        with component.holding():
            component.kill()
            component.events.record(component.name, "kill", wiped=True)
            try:
                # As a real disk replacement takes longer than fencing: a node back with an
                # empty disk while still listed in sync could be elected over full copies.
                fenced = await _await(
                    lambda: not self._cluster.listed_in_sync(node_id), FENCE_TIMEOUT_S
                )
                if not fenced:
                    raise KafkaUnavailable(f"node {node_id} was not fenced in time")
                await asyncio.to_thread(self._cluster.replace_disk, node_id)
            except KafkaUnavailable as why:
                component.start()
                component.events.record(component.name, "restart")
                raise FaultSkipped(str(why)) from None
            component.start()
        component.events.record(component.name, "restart", empty_disk=True)
        await asyncio.to_thread(self._cluster.join_quorum, node_id, 300.0)
