"""Replays (docs/replays.md) as an operator uses them: a receiver that lost what it acknowledged
gets a window, some groups or one message again, in group order, with webhook-ids of their
own; never ahead of a parked group; beside live traffic; cancelled; carried on by another
worker when the one replaying dies. On the real broker and Redis, through the HTTP API."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from setu.clock import now_ms
from setu.policies import Policies
from tests.integration.delivery.support import (
    Call,
    ProcessWorker,
    Receiver,
    ThreadWorker,
    World,
    parked,
    sub_path,
    wait_for,
)

pytestmark = pytest.mark.integration


def publish(world: World, group: str | None, count: int) -> list[str]:
    """Messages produced now (a replay's window is of produce times)."""
    return world.publish("t", group, count, produced_at_ms=now_ms())


def replayed(receiver: Receiver, replay_id: str, group: str | None = None) -> list[Call]:
    """The calls the replay made and the receiver answered 2xx, in arrival order."""
    with receiver.lock:
        return [
            c
            for c in receiver.calls
            if c.headers.get("x_replay_id") == replay_id
            and 200 <= c.status < 300
            and (group is None or c.group == group)
        ]


def live(receiver: Receiver, group: str) -> list[str]:
    """Message ids of the group's live calls answered 2xx, in arrival order."""
    with receiver.lock:
        return [
            c.message_id
            for c in receiver.calls
            if c.group == group and "x_replay_id" not in c.headers and 200 <= c.status < 300
        ]


def ids(calls: list[Call]) -> list[str]:
    return [c.message_id for c in calls]


def start(api: httpx.Client, world: World, **body: Any) -> dict[str, Any]:
    answer = api.post(sub_path(world, "replays"), json=body)
    assert answer.status_code == 202, answer.text
    view: dict[str, Any] = answer.json()
    assert view["state"] == "running"
    return view


def view_of(api: httpx.Client, world: World, replay_id: str) -> dict[str, Any]:
    answer = api.get(sub_path(world, f"replays/{replay_id}"))
    assert answer.status_code == 200, answer.text
    view: dict[str, Any] = answer.json()
    return view


def done(api: httpx.Client, world: World, replay_id: str) -> dict[str, Any]:
    wait_for(f"replay {replay_id} done", lambda: view_of(api, world, replay_id)["state"] == "done")
    return view_of(api, world, replay_id)


def serving(
    world: World, receiver: Receiver, start_worker: Callable[..., ThreadWorker], partitions: int
) -> None:
    """Topic ``t`` of ``partitions`` and subscription ``s`` to ``receiver``, served."""
    world.topic("t", partitions=partitions)
    world.subscription(receiver.url, delays_ms=(100,))
    start_worker()


def test_a_window_is_delivered_again_in_group_order_with_webhook_ids_of_its_own(
    world: World, receiver: Receiver, start_worker: Callable[..., ThreadWorker], api: httpx.Client
) -> None:
    # Given two groups and loose messages delivered, then a group produced after the window
    serving(world, receiver, start_worker, partitions=2)
    before = now_ms()
    a, b = publish(world, "a", 6), publish(world, "b", 4)
    wait_for("a and b delivered", lambda: live(receiver, "a") == a and live(receiver, "b") == b)
    end = now_ms()
    time.sleep(0.01)
    later = publish(world, "c", 3)
    wait_for("c delivered", lambda: live(receiver, "c") == later)
    # When an operator replays the window
    replay = start(api, world, from_ms=before, to_ms=end)
    # Then every message of the window is called again, each group in order, c not at all
    wait_for("a and b replayed", lambda: len(replayed(receiver, replay["id"])) == 10)
    assert ids(replayed(receiver, replay["id"], "a")) == a
    assert ids(replayed(receiver, replay["id"], "b")) == b
    view = done(api, world, replay["id"])
    assert len(replayed(receiver, replay["id"])) == 10  # each once; none of c
    # With a webhook-id of their own, naming the replay; the originals had the message id
    call = replayed(receiver, replay["id"], "a")[0]
    assert call.headers["webhook-id"] == f"{a[0]}.{replay['id']}"
    assert call.headers["x_delivery_attempt"] == "1"
    original = next(c for c in receiver.calls if c.message_id == a[0] and c is not call)
    assert original.headers["webhook-id"] == a[0]
    # And the progress adds up; the message's delivery record links the replayed call
    progress = view["progress"]
    assert (progress["matched"], progress["delivered"], progress["failed"]) == (10, 10, 0)
    assert progress["partitions_done"] == progress["partitions"] == 2
    # (attempts are written every 200 ms: the replayed one may come just after "done")
    wait_for(
        "the replayed call in the delivery record",
        lambda: len(api.get(sub_path(world, f"messages/{a[0]}")).json()["attempts"]) == 2,
    )
    record = api.get(sub_path(world, f"messages/{a[0]}")).json()
    assert record["location"] == "delivered"
    assert [(x["replay_id"], x["webhook_id"]) for x in record["attempts"]] == [
        (None, a[0]),
        (replay["id"], f"{a[0]}.{replay['id']}"),
    ]


def test_groups_messages_and_a_filter_select_what_is_replayed(
    world: World, receiver: Receiver, start_worker: Callable[..., ThreadWorker], api: httpx.Client
) -> None:
    # Given three groups delivered
    serving(world, receiver, start_worker, partitions=2)
    before = now_ms()
    a, b, c = publish(world, "a", 3), publish(world, "b", 3), publish(world, "c", 3)
    wait_for("delivered", lambda: len(receiver.delivered()) == 9)
    # When one replay names group a, one a single message of b, one filters on the group id
    by_group = start(api, world, from_ms=before, group_ids=["a"])
    one = start(api, world, from_ms=before, message_ids=[b[1]])
    filtered = start(api, world, from_ms=before, filter={"header": "X_GROUP_ID", "equals": "c"})
    # Then each delivers exactly what it selected
    for replay, expected in ((by_group, a), (one, [b[1]]), (filtered, c)):
        view = done(api, world, replay["id"])
        assert ids(replayed(receiver, replay["id"])) == expected
        assert view["progress"]["delivered"] == len(expected)


def test_a_replay_waits_behind_a_parked_group_and_follows_its_release(
    world: World, receiver: Receiver, start_worker: Callable[..., ThreadWorker], api: httpx.Client
) -> None:
    # Given group p delivered three times, then parked in the DLQ on its fourth message;
    # group q healthy
    serving(world, receiver, start_worker, partitions=1)
    before = now_ms()
    p = publish(world, "p", 3)
    q = publish(world, "q", 3)
    wait_for("p and q delivered", lambda: live(receiver, "p") == p and live(receiver, "q") == q)
    receiver.answer("p", 400)
    p += publish(world, "p", 1)
    wait_for("p parked", lambda: parked(api, world, "p", 1))
    # When a replay covers both groups
    replay = start(api, world, from_ms=before)
    # Then q is replayed (the worker is at it) while parked p is not: it waits
    wait_for("q replayed", lambda: ids(replayed(receiver, replay["id"], "q")) == q)
    wait_for(
        "p waiting", lambda: view_of(api, world, replay["id"])["progress"]["waiting_groups"] == 1
    )
    assert view_of(api, world, replay["id"])["progress"]["waiting_group_ids"] == ["p"]
    assert not replayed(receiver, replay["id"], "p")
    assert view_of(api, world, replay["id"])["state"] == "running"
    # When the endpoint heals and the operator releases p
    receiver.heal()
    answer = api.post(sub_path(world, "dlq/unsideline"), json={"group_ids": ["p"]})
    assert answer.status_code == 200
    # Then p's parked head is delivered first, and the replay follows with all of p in order
    wait_for("p replayed", lambda: ids(replayed(receiver, replay["id"], "p")) == p)
    head_live = next(c.at for c in receiver.calls if c.message_id == p[3] and c.status == 200)
    assert all(c.at > head_live for c in replayed(receiver, replay["id"], "p"))
    view = done(api, world, replay["id"])
    assert view["progress"]["waiting_groups"] == 0
    assert view["progress"]["delivered"] == 7


def test_a_replay_racing_live_messages_of_the_same_group_keeps_both_in_order(
    world: World, receiver: Receiver, start_worker: Callable[..., ThreadWorker], api: httpx.Client
) -> None:
    # Given group g delivered
    world.topic("t", partitions=1)
    # (half the calls fail here: without a breaker, which would hold every call; it holds
    # replayed calls as live ones, docs/policies.md §2)
    world.subscription(receiver.url, delays_ms=(100, 100), policies=Policies(circuit_breaker=None))
    start_worker()
    before = now_ms()
    old = publish(world, "g", 30)
    wait_for("old delivered", lambda: live(receiver, "g") == old)
    end = now_ms()
    # When a paced replay of them runs, each replayed call failing once before it gets
    # through, while new messages of g arrive
    receiver.replay_failures = 1
    replay = start(api, world, from_ms=before, to_ms=end, rate_per_second=20)
    new: list[str] = []
    deadline = time.monotonic() + 30
    while len(replayed(receiver, replay["id"])) < 5 and time.monotonic() < deadline:
        new += publish(world, "g", 3)
        time.sleep(0.1)
    for _ in range(5):  # and on while the replay goes on
        new += publish(world, "g", 3)
        time.sleep(0.1)
    # Then the live messages arrive in order, each once, and the replay's in order, each
    # after one failed attempt (the next one numbered 2)
    wait_for("new delivered", lambda: live(receiver, "g") == old + new, timeout_s=60)
    wait_for("old replayed", lambda: ids(replayed(receiver, replay["id"])) == old, timeout_s=60)
    assert {c.attempt for c in replayed(receiver, replay["id"])} == {2}
    view = done(api, world, replay["id"])
    assert view["progress"]["delivered"] == 30
    # And they raced: live calls went on after the replay's first
    first_replayed = replayed(receiver, replay["id"])[0].at
    assert any(c.at > first_replayed for c in receiver.calls if c.message_id in new)


def test_a_cancelled_replay_stops_calling(
    world: World, receiver: Receiver, start_worker: Callable[..., ThreadWorker], api: httpx.Client
) -> None:
    # Given 30 messages delivered and a replay of them at one call a second
    serving(world, receiver, start_worker, partitions=1)
    before = now_ms()
    old = publish(world, "g", 30)
    wait_for("delivered", lambda: live(receiver, "g") == old)
    replay = start(api, world, from_ms=before, rate_per_second=1)
    wait_for("first replayed", lambda: len(replayed(receiver, replay["id"])) >= 1)
    # When it is cancelled
    answer = api.post(sub_path(world, f"replays/{replay['id']}/cancel"))
    assert answer.status_code == 200 and answer.json()["state"] == "cancelled"
    made = len(replayed(receiver, replay["id"]))
    # Then, while live messages go on being delivered for five seconds (five more replayed
    # calls at its pace), at most the one already on its way is made
    for _ in range(10):
        deliver_one_live(world, receiver)
        time.sleep(0.5)
    assert len(replayed(receiver, replay["id"])) <= made + 1
    assert view_of(api, world, replay["id"])["state"] == "cancelled"
    again = api.post(sub_path(world, f"replays/{replay['id']}/cancel"))
    assert again.status_code == 200 and again.json()["state"] == "cancelled"


def deliver_one_live(world: World, receiver: Receiver) -> None:
    """A live message, waited for: the worker is alive and calling."""
    sentinel = publish(world, "live", 1)
    wait_for("a live message delivered", lambda: live(receiver, "live")[-1:] == sentinel)


def test_another_worker_carries_a_replay_on_when_the_one_replaying_dies(
    world: World,
    receiver: Receiver,
    start_process: Callable[..., ProcessWorker],
    start_worker: Callable[..., ThreadWorker],
    api: httpx.Client,
) -> None:
    # Given 40 messages of four groups delivered by a worker process
    world.topic("t", partitions=2)
    world.subscription(receiver.url, delays_ms=(100,))
    process = start_process()
    before = now_ms()
    groups = {g: publish(world, g, 10) for g in ("a", "b", "c", "d")}
    wait_for("delivered", lambda: all(live(receiver, g) == m for g, m in groups.items()))
    end = now_ms()
    # When a slow replay starts and the worker is killed part-way through
    replay = start(api, world, from_ms=before, to_ms=end, rate_per_second=8)
    wait_for("some replayed", lambda: len(replayed(receiver, replay["id"])) >= 8)
    process.kill()
    # Then another worker takes the partitions over and finishes the replay: every message
    # is replayed, each group in order (a prefix may be called twice, never one left out)
    start_worker()
    wait_for(
        "the replay done",
        lambda: view_of(api, world, replay["id"])["state"] == "done",
        timeout_s=120,
    )
    view = view_of(api, world, replay["id"])
    for group, messages in groups.items():
        got = ids(replayed(receiver, replay["id"], group))
        firsts = list(dict.fromkeys(got))
        assert firsts == messages, group
        assert got == sorted(got, key=messages.index) or _repeats_a_prefix(got, messages), group
    assert view["progress"]["delivered"] >= 40


def _repeats_a_prefix(got: list[str], messages: list[str]) -> bool:
    """Whether ``got`` is ``messages`` in order with one stretch called again after a
    restart: an in-order run, then a restart from an earlier message on."""
    for cut in range(1, len(got)):
        head, tail = got[:cut], got[cut:]
        if head == messages[: len(head)] and tail == messages[messages.index(tail[0]) :]:
            return True
    return False


def test_bad_replays_are_refused_and_change_nothing(
    world: World, receiver: Receiver, api: httpx.Client
) -> None:
    world.topic("t", partitions=1)
    world.subscription(receiver.url)
    path = sub_path(world, "replays")
    now = now_ms()
    for body, status in (
        ({"from_ms": now + 60_000}, 400),
        ({"from_ms": now, "to_ms": now - 1}, 400),
        ({"from_ms": 0, "rate_per_second": 10**6}, 400),
        ({"from_ms": 0, "filter": {"header": "X_A", "sounds_like": "x"}}, 400),
        ({"from_ms": 0, "group_ids": []}, 400),
        ({"to_ms": now}, 400),
    ):
        answer = api.post(path, json=body)
        assert answer.status_code == status, (body, answer.text)
        assert answer.json()["error"]["code"] == "invalid_input"
    ghost = sub_path(world, "replays", "ghost")
    assert api.post(ghost, json={"from_ms": 0}).status_code == 404
    assert api.get(sub_path(world, "replays/rp_ghost")).status_code == 404
    assert api.post(sub_path(world, "replays/rp_ghost/cancel")).status_code == 404
    assert api.get(path).json() == {"replays": []}
    # A stopped subscription replays nothing: 409, as does a fifth replay running at once
    assert api.post(sub_path(world, "stop")).status_code == 200
    assert api.post(path, json={"from_ms": 0}).json()["error"]["code"] == "conflict"
    assert api.post(sub_path(world, "start")).status_code == 200
    for _ in range(4):
        assert api.post(path, json={"from_ms": now}).status_code == 202
    answer = api.post(path, json={"from_ms": now})
    assert answer.status_code == 409 and "at most 4" in answer.json()["error"]["message"]
    assert len(api.get(path).json()["replays"]) == 4
