"""Delivery at a chosen time (docs/scheduling.md) as producers and operators meet it: a scheduled
message waits for its time and its group's later messages wait behind it while other groups
flow; the views say "scheduled", not failed; a producer cancels one before its time; a held
message outlives its worker's death and Redis coming back empty. On the real broker, Redis and
the HTTP API; messages are written to the main log as the ingest job writes them."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx
import pytest

from cli.ports import any_free_port
from setu.clock import now_ms
from tests.integration.delivery.support import (
    Call,
    ProcessWorker,
    Receiver,
    ThreadWorker,
    World,
    labels,
    scrape,
    sub_path,
    wait_for,
)

pytestmark = pytest.mark.integration


def first_calls(receiver: Receiver, group: str) -> list[str]:
    """The group's messages in the order they were first answered 2xx."""
    out: list[str] = []
    for message_id in receiver.delivered(group):
        if message_id not in out:
            out.append(message_id)
    return out


def wall_ms(call: Call) -> float:
    """When the receiver took ``call``, in epoch ms (it records monotonic seconds)."""
    return (time.time() - (time.monotonic() - call.at)) * 1000


def group_view(api: httpx.Client, world: World, group: str) -> dict[str, object]:
    answer = api.get(sub_path(world, f"groups/{group}"))
    assert answer.status_code == 200, answer.text
    view: dict[str, object] = answer.json()
    return view


def record(api: httpx.Client, world: World, message_id: str) -> dict[str, object]:
    answer = api.get(sub_path(world, f"messages/{message_id}"))
    assert answer.status_code == 200, answer.text
    found: dict[str, object] = answer.json()
    return found


def test_a_scheduled_message_waits_for_its_time_with_its_group_behind_it_while_others_flow(
    world: World, receiver: Receiver, start_worker: Callable[..., ThreadWorker], api: httpx.Client
) -> None:
    # Given one partition (so both groups share it) and a worker serving it
    world.topic("t", partitions=1)
    world.subscription(receiver.url, delays_ms=(100, 200))
    start_worker()
    # When a's first message is scheduled 6 s ahead, two more of a follow it, and b publishes
    due = now_ms() + 6_000
    a = world.publish("t", "a", 1, deliver_at_ms=due) + world.publish("t", "a", 2)
    b = world.publish("t", "b", 3)
    # Then b is delivered at once, in order, while a is shown scheduled with its time
    wait_for("b delivered", lambda: first_calls(receiver, "b") == b)
    wait_for("a shown scheduled", lambda: group_view(api, world, "a")["state"] == "scheduled")
    view = group_view(api, world, "a")
    assert (view["head_message_id"], view["due_at_ms"], view["tier"]) == (a[0], due, None)
    wait_for("a's followers parked behind it", lambda: group_view(api, world, "a")["parked"] == 3)
    assert receiver.attempts(a[0]) == [] and receiver.delivered("a") == []
    # And the message's record says when it is due; the status counts a as scheduled, not failed
    wait_for(
        "the record says scheduled",
        lambda: record(api, world, a[0])["location"] == "scheduled",
    )
    assert record(api, world, a[0])["deliver_at_ms"] == due
    listed = api.get(sub_path(world, "groups"), params={"state": "scheduled"}).json()
    assert [(g["group_id"], g["due_at_ms"]) for g in listed["groups"]] == [("a", due)]
    assert api.get(sub_path(world, "groups"), params={"state": "retrying"}).json()["groups"] == []
    status = api.get(sub_path(world, "status")).json()
    assert (status["scheduled_groups"], status["failed_groups"]) == (1, 0)
    assert status["breaker"]["state"] == "closed" and status["state"] == "running"
    # And once its time comes, a is delivered in order, none of it before its time
    wait_for("a delivered", lambda: first_calls(receiver, "a") == a, 30)
    first = receiver.attempts(a[0])[0]
    assert wall_ms(first) >= due
    assert first.headers["x_deliver_at"] == str(due)
    assert first.headers["x_delivery_attempt"] == "1"
    assert min(c.at for c in receiver.attempts(a[1])) >= first.at
    wait_for("a healthy", lambda: group_view(api, world, "a")["state"] == "healthy")
    # (the attempt log is written every 200 ms)
    wait_for(
        "the record says delivered", lambda: record(api, world, a[0])["location"] == "delivered"
    )


def test_a_producer_cancels_a_scheduled_message_and_its_group_goes_on_without_it(
    world: World, receiver: Receiver, start_worker: Callable[..., ThreadWorker], api: httpx.Client
) -> None:
    # Given a grouped topic, and c's first message scheduled 4 s ahead with one behind it
    world.topic("t", partitions=2)
    world.subscription(receiver.url, delays_ms=(100,))
    start_worker()
    c = world.publish("t", "c", 1, deliver_at_ms=now_ms() + 4_000) + world.publish("t", "c")
    wait_for("c scheduled", lambda: group_view(api, world, "c")["state"] == "scheduled")
    # When its producer cancels it before its time (twice: the first cancel's time stands)
    path = f"/v1/projects/{world.project}/topics/t/messages/{c[0]}/cancel"
    first = api.post(path)
    assert first.status_code == 200, first.text
    assert first.json()["message_id"] == c[0]
    assert api.post(path).json()["cancelled_at_ms"] == first.json()["cancelled_at_ms"]
    # Then the message behind it is delivered at the cancelled one's time, which never is
    wait_for("c's second message delivered", lambda: receiver.delivered("c") == [c[1]], 30)
    assert receiver.attempts(c[0]) == []
    wait_for("c healthy", lambda: group_view(api, world, "c")["state"] == "healthy")
    wait_for(
        "the record says cancelled", lambda: record(api, world, c[0])["location"] == "cancelled"
    )


def test_a_cancel_names_a_grouped_topic_that_exists(world: World, api: httpx.Client) -> None:
    world.topic("loose", grouped=False)
    base = f"/v1/projects/{world.project}/topics"
    answer = api.post(f"{base}/loose/messages/m-1/cancel")
    assert answer.status_code == 400 and "not grouped" in answer.text
    assert api.post(f"{base}/nope/messages/m-1/cancel").status_code == 404


def test_a_scheduled_head_that_fails_at_its_time_is_retried_and_keeps_its_group_in_order(
    world: World, receiver: Receiver, start_worker: Callable[..., ThreadWorker], api: httpx.Client
) -> None:
    # Given a subscription with two retry tiers, an endpoint failing e's messages twice each
    world.topic("t", partitions=1)
    world.subscription(receiver.url, delays_ms=(200, 400))
    start_worker()
    receiver.fail_each("e", 2)
    # When e's first message is scheduled 2 s ahead with two behind it
    e = world.publish("t", "e", 1, deliver_at_ms=now_ms() + 2_000) + world.publish("t", "e", 2)
    # Then every message is delivered on its third attempt, in published order
    wait_for("e delivered", lambda: first_calls(receiver, "e") == e, 30)
    assert [c.attempt for c in receiver.attempts(e[0])] == [1, 2, 3]
    assert max(c.at for c in receiver.attempts(e[0])) <= min(c.at for c in receiver.attempts(e[1]))
    wait_for("e healthy", lambda: group_view(api, world, "e")["state"] == "healthy")


def test_a_held_message_outlives_its_worker_and_redis_coming_back_empty(
    world: World,
    receiver: Receiver,
    start_process: Callable[..., ProcessWorker],
    api: httpx.Client,
) -> None:
    # Given f's first message held 45 s ahead (past the restart below), one behind it
    world.topic("t", partitions=2)
    world.subscription(receiver.url, delays_ms=(100,))
    process = start_process()
    due = now_ms() + 45_000
    f = world.publish("t", "f", 1, deliver_at_ms=due) + world.publish("t", "f")
    wait_for("f scheduled", lambda: group_view(api, world, "f")["parked"] == 2, 60)
    # When the worker is killed, Redis forgets everything, and a new worker starts
    process.kill()
    world.forget_redis()
    start_process()
    sentinel = world.publish("t", "s")
    wait_for("a group published after the restart", lambda: receiver.delivered("s") == sentinel, 60)
    # Then f is still held (rebuilt from the changelog), and delivered at its time, in order
    wait_for("f shown scheduled again", lambda: group_view(api, world, "f")["parked"] == 2)
    assert group_view(api, world, "f")["state"] == "scheduled" and receiver.delivered("f") == []
    wait_for("f delivered", lambda: first_calls(receiver, "f") == f, 60)
    assert min(wall_ms(c) for c in receiver.attempts(f[0])) >= due
    assert len(receiver.attempts(f[1])) == 1


def test_scheduled_groups_are_counted_apart_on_the_workers_metrics(
    world: World, receiver: Receiver, start_worker: Callable[..., ThreadWorker]
) -> None:
    # Given twenty groups each with a message scheduled a minute ahead
    world.topic("t", partitions=2)
    world.subscription(receiver.url, delays_ms=(100,))
    port = any_free_port()
    start_worker(delivery_metrics_port=port)
    for n in range(20):
        world.publish("t", f"g{n}", 1, deliver_at_ms=now_ms() + 60_000)
    sentinel = world.publish("t", "s")
    wait_for("the sentinel delivered", lambda: receiver.delivered("s") == sentinel)
    # Then the worker shows them scheduled, none failed or retrying, and nothing called
    scheduled = ("setu_delivery_scheduled_groups", labels(world))
    wait_for("20 scheduled", lambda: scrape(port).get(scheduled) == 20)
    failed = scrape(port)
    assert failed[("setu_delivery_failed_groups", labels(world, state="retrying"))] == 0
    assert failed[("setu_delivery_retry_backlog", labels(world))] == 0
    assert receiver.delivered() == sentinel


def test_a_subscription_without_retry_tiers_still_keeps_its_group_behind_a_held_message(
    world: World, receiver: Receiver, start_worker: Callable[..., ThreadWorker], api: httpx.Client
) -> None:
    # Given a subscription that dead-letters at the first failure (no retry delays): its
    # grouped topic still gives it a tier 1, where a held message's group waits
    world.topic("t", partitions=1)
    world.subscription(receiver.url, delays_ms=())
    start_worker()
    # (once the worker runs: one that takes over later than 2 s after the produce finds h
    # due within a second, and calls it at its time without holding it)
    sentinel = world.publish("t", "s")
    wait_for("the sentinel delivered", lambda: receiver.delivered("s") == sentinel)
    # When h's first message is scheduled 3 s ahead with two behind it
    h = world.publish("t", "h", 1, deliver_at_ms=now_ms() + 3_000) + world.publish("t", "h", 2)
    # Then they wait, parked behind it, and are delivered in order once it is due
    wait_for("h's followers parked", lambda: group_view(api, world, "h")["parked"] == 3)
    assert receiver.delivered("h") == []
    # And the status counts the two waiting in tier 1 as retry backlog, and in the lag
    # (besides what the main log's next commit, a moment later, moves past)
    status = api.get(sub_path(world, "status")).json()
    assert status["retry_backlog"] == 2, status
    assert status["lag"] >= 2, status
    wait_for("h delivered", lambda: first_calls(receiver, "h") == h, 30)
    wait_for("h healthy", lambda: group_view(api, world, "h")["state"] == "healthy")
