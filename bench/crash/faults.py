"""Faults beyond a process kill, for the crash test's chaos loop: nodes that lose what they
held, as real clusters do and a SIGKILL on one machine does not (the kernel keeps a killed
process's writes).

- ``redis-flush``: Redis forgets everything (``FLUSHALL``), as after a failover to a replica
  that had nothing, or a restore of an empty backup.
- ``redis-rollback``: Redis restarts from an older copy of its data folder, so it lacks its
  latest writes (a replica that lagged, a backup restored). The copy is the one the previous
  rollback took (the first takes one and rolls nothing back).
- ``broker-wipe`` (a three-node cluster): one Kafka node is SIGKILLed, loses its data folder,
  and comes back with an empty disk, formatted to join again, then is made a voter of the
  quorum again (``cli/kafka_cluster.py``). Skipped while another node lags, since losing a
  second copy is more than replication factor 3 with two in sync promises to survive.
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

import redis.asyncio as aioredis

from bench.crash.chaos import Component, FaultSkipped


async def redis_flush(url: str) -> None:
    client = aioredis.Redis.from_url(url, socket_timeout=10)
    try:
        await client.flushall()
    finally:
        await client.aclose()  # type: ignore[attr-defined]  # types-redis predates aclose


class RedisRollback:
    """Restarts Redis from the copy of its data folder taken at the previous call."""

    def __init__(
        self, component: Callable[[], Component], data: Path, ready: Callable[[], bool]
    ) -> None:
        self._component = component
        self._data = data
        self._copy = data.parent / "older-copy"
        self._ready = ready

    async def __call__(self) -> None:
        component = self._component()
        if self._copy.exists():
            with component.holding():
                component.kill()
                shutil.rmtree(self._data)
                shutil.copytree(self._copy, self._data)
                component.start()
            component.events.record(component.name, "restart", older=True)
            for _ in range(600):
                if await asyncio.to_thread(self._ready):
                    break
                await asyncio.sleep(0.1)
        # The next rollback goes back to now (a live copy: Redis loads a torn AOF tail).
        shutil.rmtree(self._copy, ignore_errors=True)
        await asyncio.to_thread(shutil.copytree, self._data, self._copy)


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
            if (c := self._components.get(f"kafka-{node.node_id}")) is not None and c.alive
        ]
        if len(alive) < len(self._cluster.nodes):
            raise FaultSkipped("a node is down already")
        node_id = self._rng.choice(alive)
        component = self._components[f"kafka-{node_id}"]
        with component.holding():
            component.kill()
            component.events.record(component.name, "kill", wiped=True)
            try:
                await asyncio.to_thread(self._cluster.replace_disk, node_id)
            except KafkaUnavailable as why:
                component.start()
                component.events.record(component.name, "restart")
                raise FaultSkipped(str(why)) from None
            component.start()
        component.events.record(component.name, "restart", empty_disk=True)
        await asyncio.to_thread(self._cluster.join_quorum, node_id, 300.0)
