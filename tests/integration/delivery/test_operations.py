"""The operator endpoints of delivery (docs/design.md §5) against a running worker."""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from cli.ports import any_free_port
from setu.clock import now_ms
from setu.model import DeadLetterPolicy
from tests.integration.delivery.support import (
    Receiver,
    ThreadWorker,
    World,
    labels,
    parked,
    scrape,
    sub_path,
    wait_for,
)

pytestmark = pytest.mark.integration


def test_status_and_group_state_follow_delivery(
    world: World, receiver: Receiver, start_worker: Callable[..., ThreadWorker], api: httpx.Client
) -> None:
    # Given g1 rejected (400), g2 failing with long retries, g3 healthy
    world.topic("t")
    world.subscription(receiver.url, delays_ms=(60_000,))
    receiver.answer("g1", 400)
    receiver.answer("g2", 503)
    g1 = world.publish("t", "g1", 3)
    g2 = world.publish("t", "g2", 2)
    world.publish("t", "g3", 4)
    start_worker()
    wait_for("g1 parked", lambda: parked(api, world, "g1", 3))
    # Then the groups read as parked, retrying and healthy
    assert api.get(sub_path(world, "groups/g1")).json() == {
        "group_id": "g1",
        "state": "dead_lettered",
        "tier": "dlq",
        "parked": 3,
        "head_message_id": g1[0],
        "due_at_ms": None,
        "group_state": "ok",
    }
    wait_for("g2 retrying", lambda: api.get(sub_path(world, "groups/g2")).json()["parked"] == 2)
    assert api.get(sub_path(world, "groups/g2")).json() == {
        "group_id": "g2",
        "state": "retrying",
        "tier": "rq.1",
        "parked": 2,
        "head_message_id": g2[0],
        "due_at_ms": None,
        "group_state": "ok",
    }
    assert api.get(sub_path(world, "groups/g3")).json()["state"] == "healthy"

    # And the status counts them; g2's two messages wait in rq.1 (the retry backlog)
    def settled() -> bool:
        s = api.get(sub_path(world, "status")).json()
        return bool(s["delivered_total"] == 4 and s["lag"] == 2)

    wait_for("status settled", settled)
    status = api.get(sub_path(world, "status")).json()
    assert status == {
        "state": "running",
        "group_state": "ok",
        "paused_reason": None,
        "breaker": status["breaker"],
        "lag": 2,
        "in_flight": status["in_flight"],
        "failed_groups": 2,
        "scheduled_groups": 0,
        "retry_backlog": 2,
        "dead_lettered": 3,
        "delivered_total": 4,
        "oldest_undelivered_age_ms": status["oldest_undelivered_age_ms"],
        "partitions": status["partitions"],
        "ingest": status["ingest"],  # no ingest job runs here (see test_health_docs)
        "oldest_parked_age_ms": status["oldest_parked_age_ms"],
        "parked_expire_in_ms": None,  # dead letters are kept for ever by default
        "oldest_retrying_age_ms": status["oldest_retrying_age_ms"],
        "retrying_expire_in_ms": status["retrying_expire_in_ms"],
    }
    # And the parked and retrying groups' ages show against the retry tiers' retention
    for standing in ("parked", "retrying"):
        assert 0 <= status[f"oldest_{standing}_age_ms"] < 120_000
    week = 168 * 3_600_000
    assert week - 120_000 < status["retrying_expire_in_ms"] <= week
    # One 503 among the calls is no outage (the worker may not have reported yet)
    assert status["breaker"]["state"] == "closed"
    assert status["breaker"]["last_error"] in (None, "HTTP 503")
    # And per partition: g2's two messages wait where g2 hashes, since they were published
    waiting = [p for p in status["partitions"] if p["lag"]]
    assert [p["lag"] for p in waiting] == [2] and len(status["partitions"]) == 2
    assert 0 < status["oldest_undelivered_age_ms"] < 120_000
    assert waiting[0]["oldest_undelivered_ms"] <= now_ms() - status["oldest_undelivered_age_ms"]
    assert {"state", "ok", "lag"} <= set(status["ingest"])

    # And the unhealthy groups are listed, the longest unhealthy first, one page at a time
    listed = api.get(sub_path(world, "groups")).json()
    assert [(g["group_id"], g["state"]) for g in listed["groups"]] in (
        [("g1", "dead_lettered"), ("g2", "retrying")],
        [("g2", "retrying"), ("g1", "dead_lettered")],
    )
    assert listed["next"] is None
    assert all(g["since_ms"] > 0 for g in listed["groups"])
    by_standing = api.get(sub_path(world, "groups"), params={"state": "dead_lettered"}).json()
    assert [g["group_id"] for g in by_standing["groups"]] == ["g1"]
    assert by_standing["groups"][0] == {
        **api.get(sub_path(world, "groups/g1")).json(),
        "since_ms": by_standing["groups"][0]["since_ms"],
    }
    first = api.get(sub_path(world, "groups"), params={"limit": 1}).json()
    second = api.get(sub_path(world, "groups"), params={"limit": 1, "after": first["next"]}).json()
    assert [g["group_id"] for g in first["groups"] + second["groups"]] == [
        g["group_id"] for g in listed["groups"]
    ]
    assert second["next"] is None
    for bad in ({"state": "healthy"}, {"after": "soon"}, {"limit": 0}):
        assert api.get(sub_path(world, "groups"), params=bad).status_code == 400


def test_dead_letters_are_browsed_then_unsidelined_in_order(
    world: World, receiver: Receiver, start_worker: Callable[..., ThreadWorker], api: httpx.Client
) -> None:
    # Given two groups parked in the DLQ
    world.topic("t", partitions=1)
    world.subscription(receiver.url, delays_ms=(100,))
    receiver.answer("a", 400)
    receiver.answer("b", 422)
    a = world.publish("t", "a", 3)
    b = world.publish("t", "b", 2)
    start_worker()
    wait_for("parked", lambda: parked(api, world, "a", 3) and parked(api, world, "b", 2))
    # When browsing with a page size of 2
    page = api.get(sub_path(world, "dlq/messages"), params={"limit": 2}).json()
    rest = api.get(sub_path(world, "dlq/messages"), params={"after": page["next"]}).json()
    letters = page["messages"] + rest["messages"]
    # Then every dead letter is listed once, in DLQ order (each group's in published order),
    # with its failure and body
    listed = [m["message_id"] for m in letters]
    assert sorted(listed) == sorted(a + b)
    assert [m["offset"] for m in letters] == sorted(m["offset"] for m in letters)
    assert [m for m in listed if m in a] == a and [m for m in listed if m in b] == b
    assert rest["next"] is None
    head = next(m for m in letters if m["message_id"] == a[0])
    assert (head["last_status"], head["attempts"], head["parked"]) == (400, 1, True)
    assert base64.b64decode(head["body"]) == a[0].encode()
    only_b = api.get(sub_path(world, "dlq/messages"), params={"group_id": "b"}).json()["messages"]
    assert [m["message_id"] for m in only_b] == b
    # When the endpoint recovers and an operator unsidelines group a by one of its message ids
    receiver.heal()
    answer = api.post(sub_path(world, "dlq/unsideline"), json={"message_ids": [a[2]]})
    assert answer.status_code == 200 and answer.json() == {"requeued": 3}
    # Then a is delivered in published order and leaves the DLQ listing; b stays parked
    wait_for("a delivered", lambda: receiver.delivered("a") == a)
    wait_for("a healthy", lambda: api.get(sub_path(world, "groups/a")).json()["state"] == "healthy")
    listed = api.get(sub_path(world, "dlq/messages")).json()["messages"]
    assert [m["message_id"] for m in listed] == b
    # And unsidelining by failed_before picks up b
    answer = api.post(sub_path(world, "dlq/unsideline"), json={"failed_before": 2**62})
    assert answer.json() == {"requeued": 2}
    wait_for("b delivered", lambda: receiver.delivered("b") == b)
    assert api.get(sub_path(world, "dlq/messages")).json()["messages"] == []


def test_single_dead_letters_are_unsidelined_by_group(
    world: World, receiver: Receiver, start_worker: Callable[..., ThreadWorker], api: httpx.Client
) -> None:
    # Given the skip policy: rejected messages are dead letters of their own
    world.topic("t")
    world.subscription(receiver.url, delays_ms=(100,), policy=DeadLetterPolicy.SKIP)
    receiver.answer("g", 400)
    ids = world.publish("t", "g", 3)
    start_worker()
    wait_for(
        "all dead",
        lambda: len(api.get(sub_path(world, "dlq/messages")).json()["messages"]) == 3,
    )
    receiver.heal()
    answer = api.post(sub_path(world, "dlq/unsideline"), json={"group_ids": ["g"]})
    assert answer.json() == {"requeued": 3}
    # Then they are delivered again, one at a time, in order
    wait_for("redelivered", lambda: receiver.delivered("g") == ids)
    wait_for(
        "listing empty", lambda: api.get(sub_path(world, "dlq/messages")).json()["messages"] == []
    )


def test_seek_needs_a_stopped_subscription_and_operations_check_their_input(
    world: World, receiver: Receiver, api: httpx.Client
) -> None:
    world.topic("t")
    world.subscription(receiver.url)
    busy = api.post(sub_path(world, "seek"), json={"timestamp_ms": 0})
    assert busy.status_code == 409 and busy.json()["error"]["code"] == "conflict"
    api.post(sub_path(world, "stop"))
    done = api.post(sub_path(world, "seek"), json={"timestamp_ms": 5})
    assert done.json() == {"state": "stopped", "seek_to_ms": 5, "seek_generation": 1}
    both = api.post(
        sub_path(world, "dlq/unsideline"), json={"group_ids": ["a"], "failed_before": 1}
    )
    assert both.status_code == 400 and both.json()["error"]["code"] == "invalid_input"
    bad_cursor = api.get(sub_path(world, "dlq/messages"), params={"after": "x"})
    assert bad_cursor.status_code == 400
    missing = api.get(sub_path(world, "status", sub="nope"))
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"


def test_an_unsidelined_group_failing_again_retries_through_the_tiers_and_parks_again(
    world: World, receiver: Receiver, start_worker: Callable[..., ThreadWorker], api: httpx.Client
) -> None:
    # Given group a parked in the DLQ by a 400, and a worker serving its metrics
    world.topic("t", partitions=1)
    world.subscription(receiver.url, delays_ms=(1500, 200))
    receiver.answer("a", 400)
    a = world.publish("t", "a", 2)
    port = any_free_port()
    start_worker(delivery_metrics_port=port)
    wait_for("a parked", lambda: parked(api, world, "a", 2))
    # When an operator unsidelines it but the endpoint now answers 503
    receiver.answer("a", 503)
    answer = api.post(sub_path(world, "dlq/unsideline"), json={"group_ids": ["a"]})
    assert answer.json() == {"requeued": 2}
    # Then the head goes round the retry tiers again: the group reads as retrying in rq.1
    wait_for(
        "a retrying in rq.1",
        lambda: (
            api.get(sub_path(world, "groups/a")).json()
            == {
                "group_id": "a",
                "state": "retrying",
                "tier": "rq.1",
                "parked": 2,
                "head_message_id": a[0],
                "due_at_ms": None,
                "group_state": "ok",
            }
        ),
    )
    # And, failing in the last tier, parks the group again on the same letter
    wait_for("four attempts", lambda: len(receiver.attempts(a[0])) == 4)
    wait_for("a parked again", lambda: parked(api, world, "a", 2))
    assert [c.attempt for c in receiver.attempts(a[0])] == [1, 2, 3, 4]
    assert receiver.attempts(a[1]) == []
    # And its dead letter shows the latest attempt; no second letter appeared
    letters = api.get(sub_path(world, "dlq/messages")).json()["messages"]
    assert [m["message_id"] for m in letters] == a
    assert (letters[0]["attempts"], letters[0]["last_status"]) == (4, 503)
    assert api.get(sub_path(world, "status")).json()["dead_lettered"] == 3
    # And the worker's metrics show the lap and the group parked again
    got = scrape(port)
    assert got[("setu_delivery_moves_total", labels(world, kind="lap", tier="rq.1"))] == 1
    assert got[("setu_delivery_moves_total", labels(world, kind="lap", tier="rq.2"))] == 1
    assert got[("setu_delivery_reparked_total", labels(world))] == 1
    assert got[("setu_delivery_failed_groups", labels(world, state="dead_lettered"))] == 1
    assert got[("setu_delivery_parked_messages", labels(world))] == 2  # a's two letters
    assert got[("setu_delivery_calls_total", labels(world, result="retry"))] == 3
    # When the endpoint recovers and the group is unsidelined again
    receiver.heal()
    api.post(sub_path(world, "dlq/unsideline"), json={"group_ids": ["a"]})
    # Then it is delivered in order, the attempt count going on
    wait_for("a delivered", lambda: receiver.delivered("a") == a)
    assert receiver.attempts(a[0])[-1].attempt == 5
    wait_for(
        "listing empty", lambda: api.get(sub_path(world, "dlq/messages")).json()["messages"] == []
    )


@pytest.mark.finding("L5")
def test_a_message_s_delivery_record_shows_each_attempt_and_move(
    world: World, receiver: Receiver, start_worker: Callable[..., ThreadWorker], api: httpx.Client
) -> None:
    # Given a group whose head fails twice (503) and then goes through, and a group rejected
    world.topic("t")
    world.subscription(receiver.url, delays_ms=(100, 100, 100))
    receiver.fail_each("g1", 2)
    receiver.answer("g2", 400)
    [head, follower] = world.publish("t", "g1", 2)
    [rejected] = world.publish("t", "g2", 1)
    start_worker()
    wait_for("g1 delivered", lambda: receiver.delivered("g1") == [head, follower])

    def record(message_id: str) -> dict[str, Any]:
        answer = api.get(sub_path(world, f"messages/{message_id}"))
        return answer.json() if answer.status_code == 200 else {}

    # Then the head's record shows its three attempts, the failures with the receiver's answer
    wait_for("head delivered", lambda: record(head).get("location") == "delivered")
    story = record(head)
    assert [(a["attempt"], a["outcome"], a["status"]) for a in story["attempts"]] == [
        (1, "retry", 503),
        (2, "retry", 503),
        (3, "delivered", 200),
    ]
    assert story["attempts"][0]["response_excerpt"] == '{"refused": 503}'
    assert story["attempts"][2]["response_excerpt"] is None
    # And a key that may not read bodies (a viewer) sees the attempts but not the answer,
    # which may echo the request's body; an operator's key sees it
    for role, excerpt in (("viewer", None), ("operator", '{"refused": 503}')):
        minted = api.post(
            f"/v1/projects/{world.project}/keys", json={"name": f"{role}-1", "role": role}
        )
        assert minted.status_code == 201, minted.text
        seen = api.get(
            sub_path(world, f"messages/{head}"),
            headers={"Authorization": f"Bearer {minted.json()['key']}"},
        )
        assert seen.status_code == 200, seen.text
        assert seen.json()["attempts"][0]["status"] == 503
        assert seen.json()["attempts"][0]["response_excerpt"] == excerpt
    assert all(a["duration_ms"] >= 0 and a["at_ms"] > 0 for a in story["attempts"])
    assert story["moves"] and story["moves"][0]["to"] == "rq.1"
    # And the follower was moved behind its group before its first attempt (it fails twice too)
    wait_for("follower recorded", lambda: record(follower).get("location") == "delivered")
    behind = record(follower)
    assert behind["moves"][0]["why"] == "park"
    assert behind["moves"][0]["at_ms"] <= behind["attempts"][0]["at_ms"]
    assert [a["attempt"] for a in behind["attempts"]] == [1, 2, 3]
    # And the rejected message reads as dead-lettered
    wait_for("rejected in the DLQ", lambda: record(rejected).get("location") == "dlq")
    assert record(rejected)["attempts"][0]["status"] == 400
    # And an unknown message is a 404
    assert api.get(sub_path(world, "messages/nope")).status_code == 404


def test_a_stuck_group_is_found_and_fixed_with_the_setu_commands(
    world: World,
    receiver: Receiver,
    start_worker: Callable[..., ThreadWorker],
    api: httpx.Client,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from cli.main import main as setu

    monkeypatch.setenv("SETU_API_URL", str(api.base_url))
    monkeypatch.setenv("SETU_API_KEY", api.headers["Authorization"].removeprefix("Bearer "))

    def run(*argv: str) -> str:
        assert setu(list(argv)) == 0, capsys.readouterr().err
        return capsys.readouterr().out

    # Given a group whose endpoint rejects it: parked in the DLQ with its later messages
    world.topic("t")
    world.subscription(receiver.url, delays_ms=(100,))
    receiver.answer("stuck", 422)
    ids = world.publish("t", "stuck", 3, body=lambda m: b'{"order": "%s"}' % m.encode())
    start_worker()
    wait_for("parked", lambda: parked(api, world, "stuck", 3))
    p, s = world.project, "s"
    # (the worker writes attempt records every 200 ms: the head's is there soon after)
    wait_for(
        "head's record",
        lambda: api.get(sub_path(world, f"messages/{ids[0]}")).status_code == 200,
    )
    # When the operator looks: the group is listed, its head's story and letter are shown
    listed = run("groups", p, s, "--state", "dead_lettered")
    assert "stuck" in listed and "dead_lettered" in listed
    story = run("message", "show", p, s, ids[0])
    assert f"{ids[0]}: dlq" in story and "422" in story and '{"refused": 422}' in story
    letter = run("dlq", "show", p, s, ids[0])
    assert f'"order": "{ids[0]}"' in letter  # the body, as pretty JSON
    # And fixes it with one command once the endpoint is fixed
    receiver.heal()
    assert run("dlq", "unsideline", p, s, "--group", "stuck").strip() == "requeued 3"
    # Then the group is delivered in order and nothing is unhealthy any more
    wait_for("delivered", lambda: receiver.delivered("stuck") == ids)
    wait_for("healthy", lambda: "every group is healthy" in run("groups", p, s))
