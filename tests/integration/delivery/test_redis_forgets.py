"""Redis forgets, Setu does not (docs/design.md §4, "Redis may forget"): a Redis that comes back
empty or from an older snapshot costs no message, no order and no parked group, and delivery
goes on within a minute."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from cli.ports import any_free_port
from setu import names
from setu.partitioner import partition_for
from state import keys
from state.groups import RedisGroupStore
from tests.integration.delivery.support import (
    Receiver,
    ThreadWorker,
    World,
    labels,
    scrape,
    wait_for,
)

pytestmark = pytest.mark.integration


def path(world: World, tail: str) -> str:
    return f"/v1/projects/{world.project}/subscriptions/s/{tail}"


def view(api: httpx.Client, world: World, group: str) -> dict[str, object]:
    body: dict[str, object] = api.get(path(world, f"groups/{group}")).json()
    return body


def in_order(receiver: Receiver, group: str, published: list[str]) -> bool:
    """Every message of ``group`` delivered, first deliveries in published order."""
    first: list[str] = []
    for message_id in receiver.delivered(group):
        if message_id not in first:
            first.append(message_id)
    return first == published


def test_a_parked_group_stays_parked_and_the_rest_flows_when_redis_comes_back_empty(
    world: World, receiver: Receiver, start_worker: Callable[..., ThreadWorker], api: httpx.Client
) -> None:
    # Given a grouped subscription: G parked behind its dead-lettered head (400), R retrying,
    # its last retry 20 s away (so it is still retrying, within its budget, when its endpoint
    # heals below however fast the rebuild goes)
    world.topic("t", partitions=2)
    world.subscription(receiver.url, delays_ms=(300, 20_000))
    receiver.answer("G", 400)
    receiver.answer("R", 503)
    g = world.publish("t", "G", 3)
    r = world.publish("t", "R", 3)
    port = any_free_port()
    start_worker(delivery_metrics_port=port)
    wait_for("G parked", lambda: view(api, world, "G")["parked"] == 3)
    wait_for("R retrying", lambda: view(api, world, "R")["state"] == "retrying")

    # When Redis forgets everything, as a failover to an empty replica does
    world.forget_redis()
    fresh = [world.publish("t", f"H{n}")[0] for n in range(20)]

    # Then the worker rebuilds its partitions from the changelog, and the other groups are
    # delivered within a minute: nothing crash-loops
    wait_for("20 new groups delivered", lambda: set(fresh) <= set(receiver.delivered()), 60)
    rebuilds = ("setu_delivery_state_rebuilds_total", labels(world))
    wait_for("a rebuild", lambda: scrape(port).get(rebuilds, 0) >= 1, 60)
    sentinel = world.publish("t", "S")
    wait_for("a group published after the rebuild", lambda: sentinel[0] in receiver.delivered())
    # And the parked group is still parked, and the views say so once rebuilt
    wait_for("G shown parked again", lambda: view(api, world, "G")["parked"] == 3, 30)
    assert view(api, world, "G") == {
        "group_id": "G",
        "state": "dead_lettered",
        "tier": "dlq",
        "parked": 3,
        "head_message_id": g[0],
        "due_at_ms": None,
        "group_state": "ok",
    }
    listed = api.get(path(world, "groups")).json()
    assert listed["group_state"] == "ok"
    assert {x["group_id"] for x in listed["groups"]} == {"G", "R"}
    letters = api.get(path(world, "dlq/messages"), params={"group_id": "G"}).json()
    assert [m["message_id"] for m in letters["messages"]] == g
    assert api.get(path(world, "status")).json()["group_state"] == "ok"
    # And G's followers were never called
    assert [c.message_id for c in receiver.calls if c.group == "G"] == [g[0]]

    # When R's endpoint heals, R is delivered in order
    receiver.heal()
    wait_for("R delivered", lambda: in_order(receiver, "R", r), 30)
    # And when an operator unsidelines G, it is delivered in order
    assert api.post(path(world, "dlq/unsideline"), json={"group_ids": ["G"]}).json() == {
        "requeued": 3
    }
    wait_for("G delivered", lambda: in_order(receiver, "G", g), 30)
    wait_for("G healthy", lambda: view(api, world, "G")["state"] == "healthy")


def test_a_redis_that_forgets_just_after_a_takeover_rebuilt_it_keeps_a_parked_group_parked(
    world: World,
    receiver: Receiver,
    start_worker: Callable[..., ThreadWorker],
    api: httpx.Client,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given G parked behind its dead-lettered head, and its worker stopped
    world.topic("t", partitions=2)
    world.subscription(receiver.url, delays_ms=(300, 600))
    receiver.answer("G", 400)
    g = world.publish("t", "G", 2)
    first = start_worker()
    wait_for("G parked", lambda: view(api, world, "G")["parked"] == 2)
    first.stop()
    # And a later message of G waiting in the main log
    g += world.publish("t", "G")

    # When the next worker takes the partitions over and Redis forgets everything just after
    # it rebuilt them from the changelog (a failover, a flush), before it read them back
    restore = RedisGroupStore.restore
    forgot: list[bool] = []

    async def restore_then_forget(
        self: RedisGroupStore, partition: int, *args: Any, **kwargs: Any
    ) -> None:
        await restore(self, partition, *args, **kwargs)
        if partition == partition_for(b"G", 2) and not forgot:
            forgot.append(True)
            await self._redis.flushall()

    monkeypatch.setattr(RedisGroupStore, "restore", restore_then_forget)
    sentinel = world.publish("t", "S")
    start_worker()

    # Then G's new message waits behind its parked head: the worker acts only on a state read
    # back with everything it wrote, and rebuilds again
    wait_for("a sentinel delivered", lambda: sentinel[0] in receiver.delivered(), 60)
    wait_for("G shown with three parked", lambda: view(api, world, "G")["parked"] == 3, 30)
    assert forgot
    assert [c.message_id for c in receiver.calls if c.group == "G"] == [g[0]]


def test_a_redis_restored_from_an_older_snapshot_is_noticed_and_rebuilt(
    world: World, receiver: Receiver, start_worker: Callable[..., ThreadWorker], api: httpx.Client
) -> None:
    # Given group A parked and B retrying, and a snapshot of Redis taken then
    world.topic("t", partitions=2)
    world.subscription(receiver.url, delays_ms=(300, 600))
    receiver.answer("A", 400)
    receiver.answer("B", 503)
    a = world.publish("t", "A", 2)
    b = world.publish("t", "B", 2)
    start_worker()
    wait_for("A parked", lambda: view(api, world, "A")["parked"] == 2)
    client = world.redis()
    pattern = keys.subscription_pattern(world.project, "s")
    snapshot = {k: client.dump(k) for k in client.scan_iter(match=pattern)}
    # And more happens after it: A parks a third message, C fails and parks too
    receiver.answer("C", 400)
    a += world.publish("t", "A")
    c = world.publish("t", "C", 2)
    wait_for("A parks three", lambda: view(api, world, "A")["parked"] == 3)
    wait_for("C parked", lambda: view(api, world, "C")["parked"] == 2)

    # When Redis comes back from the older snapshot (its later writes lost)
    for key in list(client.scan_iter(match=pattern)):
        client.delete(key)
    for key, dumped in snapshot.items():
        if dumped is not None:
            client.restore(key, 0, dumped, replace=True)
    client.close()
    sentinel = world.publish("t", "S")

    # Then the worker notices and rebuilds: A and C are parked as they were, B goes on
    wait_for("a sentinel delivered", lambda: sentinel[0] in receiver.delivered(), 60)
    wait_for("A shown with three parked", lambda: view(api, world, "A")["parked"] == 3, 30)
    wait_for("C shown parked", lambda: view(api, world, "C")["parked"] == 2, 30)
    assert [m.message_id for m in receiver.calls if m.group == "A"] == [a[0]]
    assert [m.message_id for m in receiver.calls if m.group == "C"] == [c[0]]
    receiver.heal()
    wait_for("B delivered", lambda: in_order(receiver, "B", b), 30)
    for group, ids in (("A", a), ("C", c)):
        api.post(path(world, "dlq/unsideline"), json={"group_ids": [group]})
        wait_for(f"{group} delivered", lambda ids=ids, group=group: in_order(receiver, group, ids))


def test_a_topic_from_before_the_changelog_gets_one_and_loses_no_release(
    world: World, receiver: Receiver, start_worker: Callable[..., ThreadWorker], api: httpx.Client
) -> None:
    # Given a group parked by a worker, then the topic's changelog gone, as for a topic made
    # by a version without one, and no worker running
    world.topic("t", partitions=2)
    world.subscription(receiver.url, delays_ms=(300,))
    receiver.answer("U", 400)
    u = world.publish("t", "U", 2)
    worker = start_worker()
    wait_for("U parked", lambda: view(api, world, "U")["parked"] == 2)
    worker.stop()
    changelog = names.groups_topic(world.project, "t")
    world.topics.remove([changelog])
    assert world.topics.partition_count(changelog) is None
    # When an operator unsidelines the group
    receiver.heal()
    answer = api.post(path(world, "dlq/unsideline"), json={"group_ids": ["U"]})
    # Then the request is kept in a changelog made with the topic's partitions
    assert answer.json() == {"requeued": 2}
    assert world.topics.partition_count(changelog) == 2
    # And a worker started afterwards delivers the group, in order
    start_worker()
    wait_for("U delivered", lambda: in_order(receiver, "U", u), 60)
