"""Subscription policies on the real broker and Redis (docs/policies.md)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from cli.ports import any_free_port
from setu.clock import now_ms
from setu.policies import Policies, StartFrom, parse_filter
from tests.integration.delivery.support import (
    Receiver,
    ThreadWorker,
    World,
    labels,
    scrape,
    three_workers,
    wait_for,
)

pytestmark = pytest.mark.integration

KEEP = (("X-Kind", "keep"),)
DROP = (("X_KIND", "drop"),)


def path(world: World, tail: str) -> str:
    return f"/v1/projects/{world.project}/subscriptions/s/{tail}"


def test_a_filter_skips_unwanted_messages_without_holding_their_group(
    world: World,
    receiver: Receiver,
    start_worker: Callable[..., ThreadWorker],
    api: httpx.Client,
) -> None:
    # Given a subscription that wants X_KIND=keep, whose endpoint fails g1's first call
    world.topic("t")
    world.subscription(
        receiver.url,
        delays_ms=(100, 100),
        policies=Policies(filter=parse_filter({"header": "x_kind", "equals": "keep"})),
    )
    receiver.answer("g1", 503, 200)
    [first] = world.publish("t", "g1", headers=KEEP)
    dropped = world.publish("t", "g1", 3, headers=DROP)
    [last] = world.publish("t", "g1", headers=KEEP)
    others = world.publish("t", "g2", 2, headers=DROP)
    port = any_free_port()
    start_worker(delivery_metrics_port=port)
    # Then the wanted messages arrive in order (the last is the sentinel: everything before it
    # was read) and no unwanted one was ever called
    wait_for("g1's wanted messages", lambda: receiver.delivered("g1") == [first, last])
    assert all(not receiver.attempts(m) for m in [*dropped, *others])
    # And they are counted and show as filtered in their delivery record
    filtered = ("setu_delivery_filtered_total", labels(world))
    wait_for("the filtered count", lambda: scrape(port).get(filtered) == 5)

    def location(message_id: str) -> Any:
        answer = api.get(path(world, f"messages/{message_id}"))
        return answer.json()["location"] if answer.status_code == 200 else None

    wait_for("filtered records", lambda: all(location(m) == "filtered" for m in dropped))

    # When the filter changes through the API, it applies from the next message on
    view = api.get(f"/v1/projects/{world.project}/subscriptions/s").json()
    changed = api.put(
        f"/v1/projects/{world.project}/subscriptions/s",
        json={
            "version": view["version"],
            "endpoint": {"url": receiver.url},
            "retry": {"delays_ms": [100, 100]},
            "filter": {"header": "X_KIND", "in": ["drop"]},
        },
    )
    assert changed.status_code == 200, changed.text
    # (workers read the store every 200 ms: probes go out until one is delivered, which
    # proves the worker runs the new filter)
    probes: list[str] = []

    def switched() -> bool:
        if not any(receiver.delivered("g3")):
            probes.extend(world.publish("t", "g3", headers=DROP))
            return False
        return True

    wait_for("the new filter", switched, every_s=0.3)
    unwanted = world.publish("t", "g3", headers=KEEP)
    sentinel = world.publish("t", "g3", headers=DROP)
    wait_for("the sentinel", lambda: receiver.delivered("g3")[-1:] == sentinel)
    assert not receiver.attempts(unwanted[0])


def test_the_producer_content_type_reaches_the_webhook(
    world: World, receiver: Receiver, start_worker: Callable[..., ThreadWorker]
) -> None:
    world.topic("t")
    world.subscription(receiver.url)
    [typed] = world.publish("t", "g1", content_type="application/json; charset=utf-8")
    [untyped] = world.publish("t", "g1")
    start_worker()
    wait_for("both delivered", lambda: receiver.delivered("g1") == [typed, untyped])
    assert receiver.attempts(typed)[0].headers["content-type"] == "application/json; charset=utf-8"
    assert receiver.attempts(untyped)[0].headers["content-type"] == "application/octet-stream"


@pytest.mark.parametrize("start", ["latest", "timestamp"])
def test_a_new_subscription_starts_where_it_says(
    world: World, receiver: Receiver, start_worker: Callable[..., ThreadWorker], start: str
) -> None:
    # Given messages in the topic before the subscription exists
    world.topic("t")
    before = world.publish("t", "g1", 3)
    cut = now_ms() + 1
    start_from = StartFrom("latest") if start == "latest" else StartFrom("timestamp", cut)
    while now_ms() <= cut:
        pass  # the next records carry a later timestamp than the cut
    world.subscription(receiver.url, policies=Policies(start_from=start_from))
    after = world.publish("t", "g1", 2)
    # When a worker runs it
    start_worker()
    # Then only the messages after the start are delivered (the later ones are the sentinel)
    wait_for("the later messages", lambda: receiver.delivered("g1") == after)
    assert not any(receiver.attempts(m) for m in before)


def call_in_progress(
    world: World,
    receiver: Receiver,
    start_worker: Callable[..., ThreadWorker],
    delay_s: float,
) -> str:
    """A subscription whose endpoint answers after ``delay_s``, and its first call under way."""
    world.topic("t")
    world.subscription(receiver.url)
    receiver.delay_s = delay_s
    [slow] = world.publish("t", "g1")
    start_worker()
    wait_for("the call in progress", lambda: receiver.active == 1)
    return slow


def test_a_graceful_stop_lets_the_call_in_progress_finish_and_confirms(
    world: World,
    receiver: Receiver,
    start_worker: Callable[..., ThreadWorker],
    api: httpx.Client,
) -> None:
    # Given a call in progress at a slow endpoint
    slow = call_in_progress(world, receiver, start_worker, delay_s=1.5)
    # When it is stopped gracefully
    answer = api.post(path(world, "stop"), json={"mode": "graceful"})
    # Then the answer comes once the worker confirmed, after the call finished
    assert answer.status_code == 200, answer.text
    stop = answer.json()
    assert (stop["state"], stop["mode"], stop["confirmed"]) == ("stopped", "graceful", True)
    [worker] = stop["workers"]
    assert (worker["abandoned_calls"], worker["drained"]) == (0, True)
    assert worker["stopped_at_ms"] >= stop["requested_at_ms"]
    assert receiver.delivered("g1") == [slow] and receiver.active == 0
    # And once started again, that message is not called again (the next one is the sentinel)
    receiver.delay_s = 0
    assert api.post(path(world, "start")).json() == {"state": "running"}
    [sentinel] = world.publish("t", "g1")
    wait_for("the sentinel", lambda: receiver.delivered("g1") == [slow, sentinel])


def test_a_forced_stop_abandons_the_call_in_progress_and_it_is_made_again_on_start(
    world: World,
    receiver: Receiver,
    start_worker: Callable[..., ThreadWorker],
    api: httpx.Client,
) -> None:
    # Given a call in progress at a very slow endpoint
    slow = call_in_progress(world, receiver, start_worker, delay_s=4)
    # When it is stopped by force
    stop = api.post(path(world, "stop"), json={"mode": "forced"}).json()
    # Then the worker confirmed without waiting for the call, which it abandoned
    assert (stop["mode"], stop["confirmed"]) == ("forced", True)
    assert [w["abandoned_calls"] for w in stop["workers"]] == [1]
    assert receiver.active == 1  # the endpoint is still answering the abandoned call
    # And on start the message is called again, with the same webhook-id and attempt number
    receiver.delay_s = 0
    api.post(path(world, "start"))
    wait_for("the call made again", lambda: len(receiver.attempts(slow)) == 2)
    first, again = receiver.attempts(slow)
    assert first.headers["webhook-id"] == again.headers["webhook-id"] == slow
    assert again.attempt == first.attempt == 1


def test_max_in_flight_holds_across_three_workers(
    world: World, receiver: Receiver, start_worker: Callable[..., ThreadWorker]
) -> None:
    # Given a subscription allowing 3 calls at a time, run by three workers, and a slow
    # endpoint
    world.topic("t", partitions=6)
    world.subscription(receiver.url, max_in_flight=3)
    receiver.delay_s = 0.2
    three_workers(world, start_worker)
    # When 12 groups have messages for it
    ids = {f"g{i}": world.publish("t", f"g{i}", 3) for i in range(12)}
    # Then everything is delivered in order with never more than 3 calls at the endpoint
    # (each worker alone would allow 3: up to 9)
    wait_for(
        "every group in order",
        lambda: all(receiver.delivered(g) == published for g, published in ids.items()),
        timeout_s=60,
    )
    assert 2 <= receiver.most_active <= 3, receiver.most_active


def test_the_rate_limit_holds_across_three_workers(
    world: World, receiver: Receiver, start_worker: Callable[..., ThreadWorker]
) -> None:
    # Given a subscription limited to 10 calls a second, run by three workers
    world.topic("t", partitions=6)
    world.subscription(receiver.url, rate_limit_per_second=10.0)
    three_workers(world, start_worker)
    # When 40 messages of 20 groups arrive at once
    ids = {f"g{i}": world.publish("t", f"g{i}", 2) for i in range(20)}
    wait_for(
        "every group in order",
        lambda: all(receiver.delivered(g) == published for g, published in ids.items()),
        timeout_s=60,
    )
    # Then no second saw more than the rate plus the bucket's one saved call (a tolerance of
    # one more for network jitter); three workers with a bucket each would allow 30
    times = sorted(c.at for c in receiver.calls)
    busiest = max(sum(1 for t in times if start <= t < start + 1.0) for start in times)
    assert busiest <= 12, busiest
