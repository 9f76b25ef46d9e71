"""Redis with a replica and Sentinel (docs/design.md §4): the primary is SIGKILLed while
messages flow, Sentinel promotes the replica (which may lack the last writes: replication is
asynchronous), and delivery goes on through it: nothing lost, nothing out of order, a parked
group still parked."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from cli.ports import any_free_port
from cli.probes import redis_answers
from cli.redis_local import RedisNode, SentinelNode, render_redis_conf, render_sentinel_conf
from setu.ordering.tiers import DLQ
from state.groups import RedisGroupStore
from state.redis_clients import async_redis
from tests.integration.delivery.support import (
    Receiver,
    ThreadWorker,
    World,
    wait_for,
)

pytestmark = pytest.mark.integration
MASTER = "setu"


@dataclass
class SentinelGroup:
    """A primary, a replica and three Sentinels on loopback, each its own redis-server."""

    primary: subprocess.Popen[bytes]
    replica: subprocess.Popen[bytes]
    sentinels: list[subprocess.Popen[bytes]]
    primary_port: int
    replica_port: int
    sentinel_ports: list[int]

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.primary_port}/0"

    @property
    def sentinel_list(self) -> str:
        return ",".join(f"127.0.0.1:{p}" for p in self.sentinel_ports)

    def current_primary(self) -> int:
        client = redis.Redis(port=self.sentinel_ports[0])
        try:
            _, port = client.sentinel_get_master_addr_by_name(MASTER)
            return int(port)
        finally:
            client.close()


def _start(conf: Path, log: Path, *extra: str) -> subprocess.Popen[bytes]:
    server = shutil.which("redis-server")
    assert server is not None, "redis-server is installed by scripts/install"
    return subprocess.Popen(
        [server, str(conf), *extra], stdout=log.open("ab"), stderr=subprocess.STDOUT
    )


def _answers(port: int) -> bool:
    return redis_answers(f"redis://127.0.0.1:{port}/0")


@pytest.fixture
def sentinel_group(tmp_path: Path) -> Iterator[SentinelGroup]:
    primary_port, replica_port = any_free_port(), any_free_port()
    processes: list[subprocess.Popen[bytes]] = []
    for name, port, of in (
        ("primary", primary_port, None),
        ("replica", replica_port, ("127.0.0.1", primary_port)),
    ):
        node = RedisNode(port, tmp_path / name / "data", replica_of=of)
        node.data_dir.mkdir(parents=True)
        conf = tmp_path / name / "redis.conf"
        conf.write_text(render_redis_conf(node))
        processes.append(_start(conf, tmp_path / f"{name}.log"))
        wait_for(f"redis {name}", lambda port=port: _answers(port), 30)
    sentinel_ports = [any_free_port() for _ in range(3)]
    for n, port in enumerate(sentinel_ports):
        home = tmp_path / f"sentinel-{n}"
        home.mkdir()
        conf = home / "sentinel.conf"
        node = SentinelNode(port, home, MASTER, ("127.0.0.1", primary_port), down_after_ms=1_000)
        conf.write_text(render_sentinel_conf(node))
        processes.append(_start(conf, tmp_path / f"sentinel-{n}.log", "--sentinel"))
    group = SentinelGroup(
        processes[0], processes[1], processes[2:], primary_port, replica_port, sentinel_ports
    )
    wait_for("sentinels to see the replica", lambda: _replicas_known(sentinel_ports[0]), 30)
    try:
        yield group
    finally:
        for process in processes:
            process.kill()
            process.wait(10)


def _replicas_known(port: int) -> bool:
    client = redis.Redis(port=port, socket_timeout=1)
    try:
        return bool(client.sentinel_slaves(MASTER))
    except redis.RedisError:
        return False
    finally:
        client.close()


def first_deliveries(receiver: Receiver, group: str) -> list[str]:
    first: list[str] = []
    for message_id in receiver.delivered(group):
        if message_id not in first:
            first.append(message_id)
    return first


def parked_in(world: World, group_set: SentinelGroup, group: str) -> int:
    """How many messages of ``group`` the current primary shows parked in the DLQ."""

    async def read() -> int:
        client = async_redis(
            world.settings(redis_sentinels=group_set.sentinel_list, redis_sentinel_master=MASTER),
            group_set.url,
            socket_timeout=2,
        )
        try:
            state = await RedisGroupStore(client, world.project, "s").group(group)
            return 0 if state is None else state.counts[DLQ]
        except redis.RedisError:
            return -1
        finally:
            await client.aclose()  # type: ignore[attr-defined]

    return asyncio.run(read())


def test_delivery_goes_on_in_order_through_a_redis_failover(
    # (Sentinel first: fixtures end in reverse, so the worker stops while Redis still answers;
    # stopped the other way round, the worker's stop waited a minute on a Redis that was gone.)
    sentinel_group: SentinelGroup,
    world: World,
    receiver: Receiver,
    start_worker: Callable[..., ThreadWorker],
) -> None:
    # Given a worker on Redis behind Sentinel, a group F parked behind a 400, and ten groups
    # whose messages keep coming
    world.topic("t", partitions=2)
    world.subscription(receiver.url, delays_ms=(300, 600))
    receiver.answer("F", 400)
    f = world.publish("t", "F", 3)
    start_worker(
        redis_url=sentinel_group.url,
        redis_sentinels=sentinel_group.sentinel_list,
        redis_sentinel_master=MASTER,
    )
    wait_for("F parked", lambda: parked_in(world, sentinel_group, "F") == 3, 60)
    published: dict[str, list[str]] = {f"G{n}": [] for n in range(10)}
    stop = threading.Event()

    def produce() -> None:
        while not stop.is_set():
            for group, ids in published.items():
                ids += world.publish("t", group)
            time.sleep(0.05)

    producer = threading.Thread(target=produce, daemon=True)
    producer.start()
    try:
        wait_for("deliveries flowing", lambda: len(receiver.delivered()) > 50, 60)
        # When the primary dies with its memory while messages flow
        sentinel_group.primary.kill()
        sentinel_group.primary.wait(10)
        # Then Sentinel promotes the replica
        wait_for(
            "the replica promoted",
            lambda: sentinel_group.current_primary() == sentinel_group.replica_port,
            60,
        )
        promoted_at = len(receiver.delivered())
        wait_for(
            "deliveries after the failover",
            lambda: len(receiver.delivered()) > promoted_at + 50,
            90,
        )
    finally:
        stop.set()
        producer.join(10)
    # And every message published is delivered, each group's first deliveries in order
    deadline = time.monotonic() + 120
    for group, ids in published.items():
        while first_deliveries(receiver, group) != ids and time.monotonic() < deadline:
            time.sleep(0.1)
        got = first_deliveries(receiver, group)
        missing = [m for m in ids if m not in got]
        in_order = got == [m for m in ids if m in got]
        assert got == ids, f"{group}: {len(missing)} missing {missing[:5]}, in order: {in_order}"
    # And F is still parked on the promoted replica, its followers never called
    wait_for("F shown parked", lambda: parked_in(world, sentinel_group, "F") == 3, 60)
    assert [c.message_id for c in receiver.calls if c.group == "F"] == [f[0]]
