"""Delivery end to end on the real broker and Redis, against a real webhook receiver."""

from __future__ import annotations

import base64
import dataclasses
import os
import time
from collections.abc import Callable

import pytest
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from cli.ports import any_free_port
from setu.model import DeadLetterPolicy, SigningSecret
from tests.integration.delivery.support import (
    ProcessWorker,
    Receiver,
    ThreadWorker,
    World,
    labels,
    replace_sub,
    scrape,
    wait_for,
)

pytestmark = pytest.mark.integration


def test_messages_of_a_group_arrive_in_order_across_retries(
    world: World, receiver: Receiver, start_worker: Callable[..., ThreadWorker]
) -> None:
    # Given a grouped subscription whose endpoint fails g2's first two calls with 503
    world.topic("t")
    world.subscription(receiver.url, delays_ms=(100, 200))
    receiver.answer("g2", 503, 503, 200)
    ids = {g: world.publish("t", g, 5) for g in ("g1", "g2", "g3")}
    # When a worker runs
    start_worker()
    # Then every group is delivered completely and in published order
    wait_for(
        "every group delivered in order",
        lambda: all(receiver.delivered(g) == published for g, published in ids.items()),
    )
    # And g2's first message went through two retry tiers (attempts 1, 2, 3)
    assert [c.attempt for c in receiver.attempts(ids["g2"][0])] == [1, 2, 3]


def test_a_flaky_endpoint_gets_every_message_through_with_its_own_attempts(
    world: World, receiver: Receiver, start_worker: Callable[..., ThreadWorker]
) -> None:
    # Given a grouped park subscription with two retry tiers, and an endpoint that fails
    # every message's first two calls with 503 (docs/delivery.md, "Retry budget")
    world.topic("t")
    world.subscription(receiver.url, delays_ms=(300, 800))
    receiver.fail_each("f", 2)
    ids = world.publish("t", "f", 3)
    healthy = world.publish("t", "h", 3)
    # When a worker runs
    start_worker()
    # Then every message of the group is delivered, in order, each on its own third attempt
    wait_for("the flaky group delivered", lambda: receiver.delivered("f") == ids, 60)
    attempts = {m: [c.attempt for c in receiver.attempts(m)] for m in ids}
    assert attempts == {m: [1, 2, 3] for m in ids}
    # And each retry waited its own backoff: the first tier's delay, then the second's
    for m in ids:
        calls = receiver.attempts(m)
        assert calls[1].at - calls[0].at >= 0.3
        assert calls[2].at - calls[1].at >= 0.8
    # And nothing was dead-lettered: the group is healthy again (the healthy group is the
    # sentinel that the worker ran all along)
    assert receiver.delivered("h") == healthy
    wait_for("the group healthy again", lambda: group_state(world, "f") == {})
    assert world.dlq_size() == 0


def group_state(world: World, group: str, sub: str = "s") -> dict[str, str]:
    from state import keys

    client = world.redis()
    try:
        raw = client.hgetall(keys.group_state(world.project, sub, group))
        return {k.decode(): v.decode() for k, v in raw.items()}
    finally:
        client.close()


def dlq_count(state: dict[str, str]) -> int:
    return int(state["counts"].split(",")[-1]) if state else 0


def request_release(world: World, group: str, partitions: int = 2, sub: str = "s") -> None:
    from setu.partitioner import partition_for
    from state import keys

    client = world.redis()
    try:
        partition = partition_for(group.encode(), partitions)
        client.sadd(keys.release_requests(world.project, sub, partition), group)
    finally:
        client.close()


def test_a_4xx_dead_letters_at_once_parks_the_group_and_unsideline_restores_order(
    world: World, receiver: Receiver, start_worker: Callable[..., ThreadWorker]
) -> None:
    # Given g1's endpoint answering 400 and a healthy g2
    world.topic("t")
    world.subscription(receiver.url, delays_ms=(100, 200))
    receiver.answer("g1", 400)
    g1 = world.publish("t", "g1", 4)
    g2 = world.publish("t", "g2", 3)
    start_worker()
    # Then g1's first message is dead-lettered after one call and the rest park behind it
    wait_for("g2 delivered", lambda: receiver.delivered("g2") == g2)
    wait_for("g1 parked", lambda: dlq_count(group_state(world, "g1")) == 4)
    assert [c.attempt for c in receiver.attempts(g1[0])] == [1]
    assert all(receiver.attempts(m) == [] for m in g1[1:])
    # When the endpoint is fixed and an operator unsidelines g1
    receiver.heal()
    request_release(world, "g1")
    # Then g1's messages arrive in published order and the group is healthy again
    wait_for("g1 delivered", lambda: receiver.delivered("g1") == g1)
    wait_for("g1 healthy", lambda: group_state(world, "g1") == {})


def test_5xx_goes_through_every_retry_tier_to_the_dlq(
    world: World, receiver: Receiver, start_worker: Callable[..., ThreadWorker]
) -> None:
    # Given an endpoint that always answers 500 for g1, and two retry tiers
    world.topic("t")
    world.subscription(receiver.url, delays_ms=(150, 300))
    receiver.answer("g1", 500)
    [message] = world.publish("t", "g1", 1)
    start_worker()
    # Then the message is tried once per tier and then parks its group in the DLQ
    wait_for("dead-lettered", lambda: dlq_count(group_state(world, "g1")) == 1, 30)
    calls = receiver.attempts(message)
    assert [c.attempt for c in calls] == [1, 2, 3]
    # And each retry waited at least its tier's delay
    assert calls[1].at - calls[0].at >= 0.15
    assert calls[2].at - calls[1].at >= 0.3


def test_under_skip_a_dead_letter_does_not_stop_its_group(
    world: World, receiver: Receiver, start_worker: Callable[..., ThreadWorker]
) -> None:
    # Given the skip policy and g1's endpoint rejecting only its first message
    world.topic("t")
    world.subscription(receiver.url, delays_ms=(100,), policy=DeadLetterPolicy.SKIP)
    g1 = world.publish("t", "g1", 4)
    receiver.rules["g1"] = lambda: 200
    first = g1[0]

    def answer() -> int:
        with_first = [c for c in receiver.calls if c.message_id == first]
        return 400 if not with_first else 200

    receiver.rules["g1"] = answer
    start_worker()
    # Then the rest of g1 is delivered in order and no group state is left
    wait_for("g1 rest delivered", lambda: receiver.delivered("g1") == g1[1:])
    assert group_state(world, "g1") == {}


def test_a_healthy_group_is_not_slowed_by_a_failing_one(
    world: World, receiver: Receiver, start_worker: Callable[..., ThreadWorker]
) -> None:
    # Given one group that keeps failing with long retry delays, on the same partition count
    world.topic("t", partitions=1)
    world.subscription(receiver.url, delays_ms=(60_000,))
    receiver.answer("bad", 503)
    bad = world.publish("t", "bad", 20)
    good = world.publish("t", "good", 50)
    start_worker()
    # Then every message of the healthy group is delivered, in order, while the bad group waits
    wait_for("good delivered", lambda: receiver.delivered("good") == good, 20)
    assert receiver.delivered("bad") == []
    assert len(receiver.attempts(bad[0])) == 1
    # And all of the bad group is parked behind its head in rq.1
    wait_for(
        "bad group parked",
        lambda: group_state(world, "bad").get("counts", "").split(",")[1:2] == ["20"],
    )
    assert group_state(world, "bad")["head"] == bad[0]


def test_a_worker_killed_mid_retry_loses_nothing_and_keeps_order(
    world: World, receiver: Receiver, start_process: Callable[..., ProcessWorker]
) -> None:
    # Given three groups failing with 503 for a while, and one healthy group
    world.topic("t", partitions=3)
    world.subscription(receiver.url, delays_ms=(300, 600, 900))
    failing = ("f1", "f2", "f3")
    for group in failing:
        receiver.answer(group, 503)
    ids = {g: world.publish("t", g, 15) for g in (*failing, "ok")}
    first = start_process()
    # When the worker is killed while the failing groups sit in retry tiers
    wait_for("healthy group delivered", lambda: receiver.delivered("ok") == ids["ok"])
    wait_for(
        "failing groups in a retry tier",
        lambda: all(len(receiver.attempts(ids[g][0])) >= 2 for g in failing),
    )
    first.kill()
    # And more messages arrive while no worker runs, then a new worker starts and the
    # endpoint recovers
    for group in ids:
        ids[group] += world.publish("t", group, 5)
    receiver.heal()
    second = start_process()

    # Then every message is delivered, each group in published order (repeats of the call
    # cut short by the kill aside), and no group state is left behind
    def complete() -> bool:
        return all(set(receiver.delivered(g)) == set(ids[g]) for g in ids)

    wait_for("everything delivered after the restart", complete, 60)
    for group, published in ids.items():
        assert first_occurrences(receiver.delivered(group)) == published
    wait_for("no failed group left", lambda: all(group_state(world, g) == {} for g in ids))
    assert second.terminate() == 0


def first_occurrences(ids: list[str]) -> list[str]:
    seen: set[str] = set()
    return [m for m in ids if not (m in seen or seen.add(m))]  # type: ignore[func-returns-value]


@pytest.mark.parametrize("held", [1, 2])
def test_calls_carry_standard_webhooks_headers_signed_with_every_secret_held(
    world: World, receiver: Receiver, start_worker: Callable[..., ThreadWorker], held: int
) -> None:
    # Given one signing secret, or two during a rotation, a fixed endpoint header and a
    # producer header
    world.topic("t")
    secrets_held = [
        SigningSecret(f"ss_{n}", "whsec_" + base64.b64encode(os.urandom(24)).decode())
        for n in range(held)
    ]
    sub = world.subscription(receiver.url, signing_secrets=tuple(secrets_held))
    world.store.update_subscription(
        replace_sub(
            sub, endpoint=dataclasses.replace(sub.endpoint, headers=(("x-team", "payments"),))
        ),
        sub.version,
    )
    [message] = world.publish(
        "t", "g1", 1, body=lambda m: b'{"id": "%s"}' % m.encode(), headers=(("X_TENANT", "acme"),)
    )
    start_worker()
    wait_for("delivered", lambda: receiver.delivered("g1") == [message])
    [call] = receiver.attempts(message)
    h = call.headers
    # Then the call names the message, its group and attempt, keeps the producer's header,
    # adds the endpoint's
    assert (h["webhook-id"], h["x_message_id"], h["x_group_id"]) == (message, message, "g1")
    assert h["x_delivery_attempt"] == "1"
    assert (h["x_tenant"], h["x-team"]) == ("acme", "payments")
    assert call.body == b'{"id": "%s"}' % message.encode()
    # And carries one signature per secret, each accepted by Standard Webhooks' own library
    assert len(h["webhook-signature"].split(" ")) == held
    for secret in secrets_held:
        assert Webhook(secret.value).verify(call.body, h) == {"id": message}
    with pytest.raises(WebhookVerificationError):
        Webhook("whsec_" + base64.b64encode(os.urandom(24)).decode()).verify(call.body, h)


def test_a_slow_endpoint_times_out_and_is_retried(
    world: World, receiver: Receiver, start_worker: Callable[..., ThreadWorker]
) -> None:
    # Given an endpoint slower than the subscription's timeout
    world.topic("t")
    world.subscription(receiver.url, delays_ms=(100, 100), timeout_ms=300)
    receiver.delay_s = 1.0
    [message] = world.publish("t", "g1", 1)
    start_worker()
    wait_for("first call", lambda: len(receiver.attempts(message)) >= 1)
    # When it speeds up again
    receiver.delay_s = 0.0
    # Then the message is delivered by a later attempt
    wait_for("delivered", lambda: any(c.attempt >= 2 for c in receiver.attempts(message)))


def test_ungrouped_calls_run_in_parallel_up_to_max_in_flight_on_reused_connections(
    world: World, receiver: Receiver, start_worker: Callable[..., ThreadWorker]
) -> None:
    world.topic("t", grouped=False, partitions=1)
    world.subscription(receiver.url, grouped=False, max_in_flight=3)
    receiver.delay_s = 0.1
    ids = world.publish("t", None, 30)
    start_worker()
    wait_for("all delivered", lambda: sorted(receiver.delivered()) == sorted(ids))
    assert receiver.most_active == 3
    assert len(receiver.peers) <= 3


def test_the_rate_limit_spaces_calls(
    world: World, receiver: Receiver, start_worker: Callable[..., ThreadWorker]
) -> None:
    world.topic("t", grouped=False, partitions=1)
    world.subscription(receiver.url, grouped=False, rate_limit_per_second=20.0)
    ids = world.publish("t", None, 30)
    start_worker()
    wait_for("all delivered", lambda: sorted(receiver.delivered()) == sorted(ids))
    times = sorted(c.at for c in receiver.calls)
    # 30 calls at 20/s with a burst of 2: at least 1.4 s from the first to the last
    assert times[-1] - times[0] >= 1.3


def test_lifecycle_changes_and_new_subscriptions_apply_without_a_restart(
    world: World, receiver: Receiver, start_worker: Callable[..., ThreadWorker]
) -> None:
    from state.lifecycle import LifecycleAction

    world.topic("t")
    world.subscription(receiver.url)
    # A second subscription of the topic on the same worker, never paused: the sentinel
    sentinel = "/sentinel"
    world.subscription(receiver.url.replace("/hook", sentinel), name="sentinel")
    start_worker()
    first = world.publish("t", "g1", 2)
    wait_for("delivered while running", lambda: receiver.delivered("g1", "/hook") == first)
    # When paused (the worker reports it), nothing is delivered: the sentinel delivers what
    # was published meanwhile, and the paused subscription's worker reports in after that
    world.store.apply_lifecycle(world.project, "s", LifecycleAction.PAUSE)
    wait_for("the worker to pause", lambda: any(r["paused"] for r in world.worker_reports()))
    paused = world.publish("t", "g1", 2)
    wait_for("the sentinel delivered", lambda: receiver.delivered("g1", sentinel)[2:] == paused)
    seen_ms = int(time.time() * 1000)
    wait_for(
        "a report of the paused runner after that",
        lambda: any(r["at"] > seen_ms and r["paused"] for r in world.worker_reports()),
    )
    assert receiver.delivered("g1", "/hook") == first
    # When resumed, what waited is delivered
    world.store.apply_lifecycle(world.project, "s", LifecycleAction.RESUME)
    wait_for("delivered after resume", lambda: receiver.delivered("g1", "/hook") == first + paused)
    # When stopped and started again, messages published meanwhile are delivered after start
    world.store.apply_lifecycle(world.project, "s", LifecycleAction.STOP)
    wait_for("consumer group empty", lambda: group_is_empty(world, "s"))
    stopped = world.publish("t", "g1", 2)
    world.store.apply_lifecycle(world.project, "s", LifecycleAction.START)
    wait_for(
        "delivered after start",
        lambda: receiver.delivered("g1", "/hook") == first + paused + stopped,
    )
    # And a subscription created while the worker runs is picked up
    world.subscription(receiver.url + "?second", name="s2")
    later = world.publish("t", "g2", 1)
    wait_for("all three subscriptions deliver", lambda: receiver.delivered("g2") == later * 3)


def test_seek_replays_the_main_log_from_a_time(
    world: World, receiver: Receiver, start_worker: Callable[..., ThreadWorker]
) -> None:
    from state.lifecycle import LifecycleAction

    world.topic("t")
    world.subscription(receiver.url)
    start_worker()
    before = world.publish("t", "g1", 2)
    wait_for("first delivery", lambda: receiver.delivered("g1") == before)
    mark = int(time.time() * 1000)
    time.sleep(0.05)
    after = world.publish("t", "g1", 2)
    wait_for("second delivery", lambda: receiver.delivered("g1") == before + after)
    # When the subscription is stopped, sought back to the mark and started again
    world.store.apply_lifecycle(world.project, "s", LifecycleAction.STOP)
    wait_for("consumer group empty", lambda: group_is_empty(world, "s"))
    world.store.request_seek(world.project, "s", mark)
    world.store.apply_lifecycle(world.project, "s", LifecycleAction.START)
    # Then the messages from the mark on are delivered again, once: a message published
    # after the replay arrives right behind it, with nothing repeated in between
    wait_for("replayed", lambda: receiver.delivered("g1") == before + after + after)
    sentinel = world.publish("t", "g1", 1)
    wait_for("the sentinel", lambda: sentinel[0] in receiver.delivered("g1"))
    assert receiver.delivered("g1") == before + after + after + sentinel


def test_two_workers_share_a_subscription_and_keep_order_through_rebalances(
    world: World, receiver: Receiver, start_worker: Callable[..., ThreadWorker]
) -> None:
    world.topic("t", partitions=4)
    world.subscription(receiver.url)
    groups = [f"g{i}" for i in range(8)]
    ids = {g: world.publish("t", g, 10) for g in groups}
    start_worker(worker_id=f"a-{world.project}")
    wait_for("some delivered", lambda: len(receiver.delivered()) >= 10)
    # When a second worker joins (a rebalance) while messages keep coming
    start_worker(worker_id=f"b-{world.project}")
    for g in groups:
        ids[g] += world.publish("t", g, 10)
    # Then everything is delivered once, each group in order
    wait_for(
        "all delivered",
        lambda: all(set(receiver.delivered(g)) == set(ids[g]) for g in groups),
        60,
    )
    for g in groups:
        assert receiver.delivered(g) == ids[g]


def test_a_retry_tier_held_across_a_rebalance_is_read_again_once_due(
    world: World, receiver: Receiver, start_worker: Callable[..., ThreadWorker]
) -> None:
    # Given a message whose first call failed, waiting in rq.1 for its due time (its tier
    # partition is paused meanwhile), on a worker whose name sorts first
    world.topic("t", partitions=1)
    world.subscription(receiver.url, delays_ms=(15_000,))
    receiver.fail_each("g", 1)
    start_worker(worker_id=f"a-{world.project}")
    [held] = world.publish("t", "g", 1)
    wait_for("the first call", lambda: len(receiver.attempts(held)) == 1)
    # When a second worker joins while it waits, and the range assignor gives the partition
    # back to the first worker (a revocation and a new assignment of the same partition)
    start_worker(worker_id=f"b-{world.project}")
    wait_for("both workers in the group", lambda: group_members(world, "s") == 2, 60)
    # Then the message is called again once due and delivered (the pause of the hold
    # does not outlive the assignment it was made in)
    wait_for("the held message delivered", lambda: receiver.delivered("g") == [held], 60)
    assert [call.attempt for call in receiver.attempts(held)] == [1, 2]


def group_members(world: World, sub: str) -> int:
    """How many workers read the subscription's partitions, once their group is stable: the
    members of its consumer group, or with shared readers, of the workers' group."""
    from confluent_kafka import ConsumerGroupState
    from confluent_kafka.admin import AdminClient

    from setu import names

    admin = AdminClient({"bootstrap.servers": world.bootstrap})
    settings = world.settings()
    group = (
        settings.delivery_group
        if settings.delivery_readers == "shared"
        else names.consumer_group(world.project, sub)
    )
    [description] = admin.describe_consumer_groups([group]).values()
    result = description.result(10)
    return len(result.members) if result.state is ConsumerGroupState.STABLE else 0


def group_is_empty(world: World, sub: str) -> bool:
    from confluent_kafka.admin import AdminClient

    from setu import names

    admin = AdminClient({"bootstrap.servers": world.bootstrap})
    group = names.consumer_group(world.project, sub)
    [description] = admin.describe_consumer_groups([group]).values()
    return len(description.result(10).members) == 0


def test_messages_in_a_retry_tier_removed_by_an_update_are_still_delivered(
    world: World, receiver: Receiver, start_worker: Callable[..., ThreadWorker]
) -> None:
    # Given g1's head waiting in rq.2 of a two-tier subscription, with two messages behind it
    world.topic("t")
    sub = world.subscription(receiver.url, delays_ms=(100, 1500))
    receiver.answer("g1", 503, 503, 200)
    ids = world.publish("t", "g1", 3)
    start_worker()
    wait_for("head in rq.2", lambda: len(receiver.attempts(ids[0])) == 2)
    # When an update leaves the subscription with one tier
    world.store.update_subscription(
        replace_sub(sub, retry=dataclasses.replace(sub.retry, delays_ms=(100,))), sub.version
    )
    # Then the worker still reads rq.2, and the group is delivered in order
    wait_for("delivered", lambda: receiver.delivered("g1") == ids)


def test_a_gracefully_stopped_worker_commits_so_its_successor_repeats_no_call(
    world: World, receiver: Receiver, start_process: Callable[..., ProcessWorker]
) -> None:
    # Given a steady flow of calls that take a while each
    world.topic("t", partitions=2)
    world.subscription(receiver.url)
    receiver.delay_s = 0.02
    ids = {g: world.publish("t", g, 15) for g in (f"g{i}" for i in range(10))}
    first = start_process()
    wait_for("some delivered", lambda: len(receiver.delivered()) >= 40)
    # When the worker gets SIGTERM with calls in flight, and another worker takes over
    assert first.terminate() == 0
    start_process()
    # Then everything is delivered in order, and no message was called twice
    wait_for(
        "all delivered",
        lambda: all(set(receiver.delivered(g)) == set(m) for g, m in ids.items()),
        60,
    )
    for group, published in ids.items():
        assert receiver.delivered(group) == published
    assert len(receiver.calls) == sum(len(m) for m in ids.values())


def test_a_worker_whose_partition_was_claimed_meanwhile_is_fenced_and_starts_afresh(
    world: World, receiver: Receiver, start_worker: Callable[..., ThreadWorker]
) -> None:
    from state import keys

    # Given a worker that delivered g's first messages
    world.topic("t", partitions=1)
    world.subscription(receiver.url, delays_ms=(100, 200))
    first = world.publish("t", "g", 3)
    port = any_free_port()
    start_worker(delivery_metrics_port=port)
    wait_for("first delivered", lambda: receiver.delivered("g") == first)
    # When the partition's owner epoch moves on behind its back (another worker took it over
    # while this one stalled), and more messages arrive, the first of them failing once
    client = world.redis()
    try:
        client.incr(keys.owner_epoch(world.project, "s", 0))
    finally:
        client.close()
    receiver.answer("g", 503, 200)
    more = world.publish("t", "g", 3)

    # Then its writes are refused, it starts afresh under a new epoch, and g's messages still
    # reach the webhook first in published order
    def first_deliveries() -> list[str]:
        return list(dict.fromkeys(receiver.delivered("g")))

    wait_for("all delivered", lambda: first_deliveries() == first + more, 60)
    fenced = ("setu_delivery_runner_failures_total", labels(world, error="Fenced"))
    wait_for("the fencing counted", lambda: scrape(port).get(fenced, 0) >= 1)
    wait_for("g healthy", lambda: group_state(world, "g") == {})


def test_a_batch_the_ingest_job_wrote_twice_is_called_once_even_across_a_restart(
    world: World, receiver: Receiver, start_worker: Callable[..., ThreadWorker]
) -> None:
    from setu import names
    from setu.envelope import Envelope

    def from_ingest(offsets: range) -> None:
        """Writes what the ingest job writes for ingest partition 0's records at ``offsets``;
        offsets written before are a replayed batch (same ids, same bytes)."""
        for offset in offsets:
            group = f"g{offset % 3}"
            message_id = f"{group}-i{offset}"
            envelope = Envelope(
                message_id,
                message_id.encode(),
                group_id=group,
                ingest_partition=0,
                ingest_offset=offset,
            )
            world.producer.produce(
                names.main_topic(world.project, "t"),
                value=envelope.body,
                key=envelope.key,
                headers=list[tuple[str, str | bytes | None]](envelope.kafka_headers()),
            )
        world.producer.flush(10)

    # Given ingest offsets 0..5 in the main log, and right after them a replay of 3..5
    world.topic("t", partitions=1)
    world.subscription(receiver.url)
    from_ingest(range(6))
    from_ingest(range(3, 6))
    first = start_worker()
    wait_for("the first six delivered", lambda: len(set(receiver.delivered())) == 6)
    # When the worker stops (and commits), the ingest job replays 4..5 once more, then goes on
    first.stop()
    from_ingest(range(4, 6))
    from_ingest(range(6, 9))
    start_worker()
    # Then every message reaches the webhook once, in order within its group
    wait_for("all delivered", lambda: len(set(receiver.delivered())) == 9)
    calls = [call.message_id for call in receiver.calls]
    assert sorted(calls) == sorted(set(calls))
    for group in ("g0", "g1", "g2"):
        expected = [f"{group}-i{o}" for o in range(9) if f"g{o % 3}" == group]
        assert receiver.delivered(group) == expected
