"""Subscriptions through the HTTP API: validation, Kafka topics, PUT, lifecycle, delete."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis

from setu import names
from setu.clock import now_ms
from setu.names import dlq_topic, groups_topic, retry_topic, state_topic
from state import keys
from state.ingest_status import RedisIngestStatus
from tests.integration.api.support import Api, assert_error, drop_project, running_api, unique

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]
# A signing secret with a 20-byte key (at least 16 are required).
SECRET = "whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM="

HOOK = "https://hooks.example.com/orders"


def body(**changes: Any) -> dict[str, Any]:
    return {"name": "s", "topic": "t", "endpoint": {"url": HOOK}, **changes}


async def make_topic(api: Api, project: str, grouped: bool = True, partitions: int = 2) -> None:
    created = await api.client.post(
        f"/v1/projects/{project}/topics",
        json={"name": "t", "grouped": grouped, "partitions": partitions},
    )
    assert created.status_code == 201, created.text


async def partitions(api: Api, kafka_topic: str) -> int | None:
    return await asyncio.to_thread(api.app.state.kafka_admin.partition_count, kafka_topic)


async def test_create_starts_running_with_its_kafka_topics(api: Api, project: str) -> None:
    await make_topic(api, project, partitions=3)
    created = await api.client.post(
        f"/v1/projects/{project}/subscriptions",
        json=body(retry={"delays_ms": [100, 200]}, signing_secret=SECRET),
    )
    assert created.status_code == 201, created.text
    view = created.json()
    assert view["state"] == "running"
    assert view["version"] == 1
    assert view["grouped"] is True  # as its topic
    assert view["has_signing_secret"] is True
    assert "signing_secret" not in view and SECRET not in created.text

    # And its group state goes to its topic's changelog, made with the topic with its
    # partitions (docs/delivery.md, "A new subscription")
    assert await partitions(api, groups_topic(project, "t")) == 3
    # And it has no Kafka topic of its own: no changelog, and its retry tiers and DLQ are
    # made at its first failure (decision 0014)
    await api.app.state.services.provisioning.settled(project, "s")
    own = [retry_topic(project, "s", 1), retry_topic(project, "s", 2), dlq_topic(project, "s")]
    own.append(state_topic(project, "s"))
    assert [await partitions(api, name) for name in own] == [None] * 4
    fetched = await api.client.get(f"/v1/projects/{project}/subscriptions/s")
    assert fetched.json() == view
    listed = await api.client.get(f"/v1/projects/{project}/subscriptions")
    assert listed.json() == {"subscriptions": [view]}


async def test_create_is_idempotent_and_conflicts_on_a_difference(api: Api, project: str) -> None:
    await make_topic(api, project)
    url = f"/v1/projects/{project}/subscriptions"
    assert (await api.client.post(url, json=body())).status_code == 201
    assert (await api.client.post(url, json=body())).status_code == 200
    assert_error(await api.client.post(url, json=body(max_in_flight=3)), 409, "conflict")


async def test_grouped_subscription_on_an_ungrouped_topic_is_400(api: Api, project: str) -> None:
    await make_topic(api, project, grouped=False)
    response = await api.client.post(
        f"/v1/projects/{project}/subscriptions", json=body(grouped=True)
    )
    assert_error(response, 400, "invalid_input")
    assert "grouped topic" in response.json()["error"]["message"]
    assert await partitions(api, dlq_topic(project, "s")) is None


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8080/hook",
        "http://localhost/hook",
        "http://10.0.0.5/hook",
        "http://192.168.1.10/hook",
        "http://169.254.169.254/latest/meta-data",
        "http://[::1]:9000/hook",
        "http://2130706433/hook",  # 127.0.0.1 as one decimal number
        "http://100.100.100.200/latest/meta-data",  # shared space: a cloud's metadata
        "http://[2002:7f00:1::1]/hook",  # 6to4 carrying 127.0.0.1
    ],
)
async def test_private_and_loopback_endpoints_are_refused(api: Api, project: str, url: str) -> None:
    await make_topic(api, project)
    response = await api.client.post(
        f"/v1/projects/{project}/subscriptions", json=body(endpoint={"url": url})
    )
    assert_error(response, 400, "invalid_input")
    assert "SETU_ALLOW_PRIVATE_ENDPOINTS" in response.json()["error"]["message"]


@pytest.mark.parametrize(
    "changes",
    [
        {"endpoint": {"url": "ftp://hooks.example.com/x"}},
        {"endpoint": {"url": HOOK, "method": "GET"}},
        {"endpoint": {"url": HOOK, "timeout_ms": 0}},
        {"endpoint": {"url": HOOK, "headers": {"webhook-id": "x"}}},
        {"retry": {"delays_ms": [1] * 10}},
        {"retry": {"delays_ms": [-5]}},
        {"max_in_flight": 0},
        {"max_in_flight": 10_001},
        {"dead_letter_policy": "drop"},
        {"name": "Bad"},
        {"state": "stopped"},
        {"filter": {"header": "X_A"}},
        {"filter": {"header": "Host", "equals": "x"}},
        {"filter": {"any": []}},
        {"filter": "X_A=1"},
        {"circuit_breaker": {"failure_ratio": 0}},
        {"circuit_breaker": {"min_calls": 0}},
        {"circuit_breaker": {"open_s": "30"}},
        {"auto_pause_after_s": 0},
        {"dead_letter_window": {"size": 10, "threshold": 10}},
        {"start_from": "newest"},
        {"start_from": {"timestamp_ms": -1}},
    ],
)
async def test_invalid_subscriptions_are_400(
    api: Api, project: str, changes: dict[str, Any]
) -> None:
    await make_topic(api, project)
    response = await api.client.post(f"/v1/projects/{project}/subscriptions", json=body(**changes))
    assert_error(response, 400, "invalid_input")


async def test_policies_are_validated_stored_and_shown(api: Api, project: str) -> None:
    await make_topic(api, project)
    policies = {
        "filter": {
            "all": [
                {"header": "x-event-type", "in": ["order.created", "order.paid"]},
                {"not": {"header": "X_TEST", "exists": True}},
            ]
        },
        "circuit_breaker": {"failure_ratio": 0.8, "min_calls": 5, "window_s": 10, "open_s": 5},
        "auto_pause_after_s": 3600,
        "dead_letter_window": {"size": 20, "threshold": 5},
        "start_from": {"timestamp_ms": 1_700_000_000_000},
    }
    created = await api.client.post(f"/v1/projects/{project}/subscriptions", json=body(**policies))
    assert created.status_code == 201, created.text
    view = created.json()
    assert {k: view[k] for k in policies} == policies
    assert view["paused_reason"] is None
    # When a PUT leaves the policies out, they take their defaults (start_from is kept)
    url = f"/v1/projects/{project}/subscriptions/s"
    put = await api.client.put(url, json={"version": 1, "endpoint": {"url": HOOK}})
    assert put.status_code == 200, put.text
    defaults = {k: put.json()[k] for k in policies}
    assert defaults == {
        "filter": None,
        "circuit_breaker": {"failure_ratio": 0.5, "min_calls": 20, "window_s": 30, "open_s": 30},
        "auto_pause_after_s": 86400,
        "dead_letter_window": None,
        "start_from": {"timestamp_ms": 1_700_000_000_000},
    }
    # And null turns the breaker and auto-pause off
    off = await api.client.put(
        url,
        json={
            "version": 2,
            "endpoint": {"url": HOOK},
            "circuit_breaker": None,
            "auto_pause_after_s": None,
        },
    )
    assert (off.json()["circuit_breaker"], off.json()["auto_pause_after_s"]) == (None, None)
    # But where it started cannot change, and a bad filter changes nothing
    moved = await api.client.put(
        url, json={"version": 3, "endpoint": {"url": HOOK}, "start_from": "latest"}
    )
    assert_error(moved, 400, "invalid_input")
    assert "start_from applies when a subscription is created" in moved.text
    bad = await api.client.put(
        url, json={"version": 3, "endpoint": {"url": HOOK}, "filter": {"not": {"header": 1}}}
    )
    assert_error(bad, 400, "invalid_input")
    assert "filter.not" in bad.text
    assert (await api.client.get(url)).json()["version"] == 3


async def test_subscription_to_an_unknown_topic_is_404(api: Api, project: str) -> None:
    response = await api.client.post(f"/v1/projects/{project}/subscriptions", json=body())
    assert_error(response, 404, "not_found")


async def test_put_replaces_config_with_optimistic_versions(api: Api, project: str) -> None:
    await make_topic(api, project)
    url = f"/v1/projects/{project}/subscriptions/s"
    await api.client.post(f"/v1/projects/{project}/subscriptions", json=body(signing_secret=SECRET))
    # When the retry tiers grow from 3 to 4
    update = {
        "version": 1,
        "endpoint": {"url": HOOK, "method": "PUT"},
        "retry": {"delays_ms": [1, 2, 3, 4]},
    }
    updated = await api.client.put(url, json=update)
    assert updated.status_code == 200, updated.text
    view = updated.json()
    assert (view["version"], view["endpoint"]["method"]) == (2, "PUT")
    # Then the secret left out is kept, and a stale version conflicts; the new tier is made
    # at the first copy there, as the others are (decision 0014)
    assert await partitions(api, retry_topic(project, "s", 4)) is None
    assert view["has_signing_secret"] is True
    assert_error(await api.client.put(url, json=update), 409, "conflict")
    # When the secret is set to null it is removed
    cleared = await api.client.put(
        url, json={"version": 2, "endpoint": {"url": HOOK}, "signing_secret": None}
    )
    assert cleared.json()["has_signing_secret"] is False


NEXT_SECRET = "whsec_bmV4dC1zZWNyZXQtMTIzNDU2Nzg5MA=="


async def test_a_signing_secret_rotates_with_an_overlap_and_values_are_never_shown(
    api: Api, project: str
) -> None:
    # Given a subscription with a secret
    await make_topic(api, project)
    url = f"/v1/projects/{project}/subscriptions/s"
    created = await api.client.post(
        f"/v1/projects/{project}/subscriptions", json=body(signing_secret=SECRET)
    )
    [first] = created.json()["signing_secrets"]
    assert first["expires_at_ms"] is None
    # When a new secret comes in with an hour of overlap
    rotated = await api.client.post(
        url + "/signing-secrets",
        json={"signing_secret": NEXT_SECRET, "previous_expires_in_ms": 3_600_000},
    )
    # Then both are held, the new one first, the old one expiring in an hour
    assert rotated.status_code == 201, rotated.text
    held = rotated.json()["signing_secrets"]
    assert [s["id"] for s in held][1] == first["id"]
    new_id = held[0]["id"]
    assert held[0]["expires_at_ms"] is None
    assert held[1]["expires_at_ms"] - held[0]["created_at_ms"] == 3_600_000
    view = await api.client.get(url)
    assert view.json()["signing_secrets"] == held
    # And no answer ever carries a value
    for text in (created.text, rotated.text, view.text):
        assert SECRET not in text and NEXT_SECRET not in text
    # And the version is unchanged, so a PUT prepared before the rotation still applies, and a
    # PUT that leaves the secret out keeps both
    put = await api.client.put(url, json={"version": 1, "endpoint": {"url": HOOK}})
    assert put.json()["signing_secrets"] == held
    # When the old one is removed, the rotation ends; removing it again is 404
    removed = await api.client.delete(f"{url}/signing-secrets/{first['id']}")
    assert removed.status_code == 204
    assert [s["id"] for s in (await api.client.get(url)).json()["signing_secrets"]] == [new_id]
    assert_error(await api.client.delete(f"{url}/signing-secrets/{first['id']}"), 404, "not_found")


async def test_a_weak_rotation_secret_is_refused_and_changes_nothing(
    api: Api, project: str
) -> None:
    await make_topic(api, project)
    url = f"/v1/projects/{project}/subscriptions/s"
    await api.client.post(f"/v1/projects/{project}/subscriptions", json=body(signing_secret=SECRET))
    before = (await api.client.get(url)).json()
    for bad in (
        {"signing_secret": "whsec_"},
        {"signing_secret": NEXT_SECRET, "previous_expires_in_ms": -1},
        {"signing_secret": NEXT_SECRET, "previous_expires_in_ms": 10**12},
        {},
    ):
        response = await api.client.post(url + "/signing-secrets", json=bad)
        assert_error(response, 400, "invalid_input")
        assert NEXT_SECRET not in response.text
    assert (await api.client.get(url)).json() == before
    missing = await api.client.post(
        f"/v1/projects/{project}/subscriptions/nope/signing-secrets",
        json={"signing_secret": NEXT_SECRET},
    )
    assert_error(missing, 404, "not_found")


async def test_endpoint_header_values_are_write_only(api: Api, project: str) -> None:
    # Given a subscription whose endpoint gets a bearer token
    await make_topic(api, project)
    token = "Bearer receiver-token-" + "k" * 24
    url = f"/v1/projects/{project}/subscriptions/s"
    headers = {"Authorization": token, "X-Tenant": "acme"}
    created = await api.client.post(
        f"/v1/projects/{project}/subscriptions",
        json=body(endpoint={"url": HOOK, "headers": headers}),
    )
    assert created.status_code == 201, created.text
    # Then no read shows a value, only the names
    for response in (created, await api.client.get(url)):
        assert response.json()["endpoint"]["header_names"] == ["Authorization", "X-Tenant"]
        assert token not in response.text and "acme" not in response.text
    listed = await api.client.get(f"/v1/projects/{project}/subscriptions")
    assert token not in listed.text
    # When a PUT leaves the headers out, then they are kept (and still sent: the stored row)
    kept = await api.client.put(url, json={"version": 1, "endpoint": {"url": HOOK}})
    assert kept.json()["endpoint"]["header_names"] == ["Authorization", "X-Tenant"]
    stored = api.app.state.store.get_subscription(project, "s")
    assert dict(stored.endpoint.headers) == headers
    # When a PUT sends {} they are removed
    cleared = await api.client.put(
        url, json={"version": 2, "endpoint": {"url": HOOK, "headers": {}}}
    )
    assert cleared.json()["endpoint"]["header_names"] == []


@pytest.mark.finding("M3")
@pytest.mark.parametrize(
    ("moved_to", "kept"),
    [
        ("https://elsewhere.example.com/orders", False),  # another host
        ("http://hooks.example.com/orders", False),  # another scheme
        ("https://hooks.example.com:8443/orders", False),  # another port
        ("https://HOOKS.example.com:443/v2/orders", True),  # the same server, another path
    ],
)
async def test_header_values_never_follow_the_endpoint_to_another_server(
    api: Api, project: str, moved_to: str, kept: bool
) -> None:
    # Given a subscription whose endpoint gets a bearer token
    await make_topic(api, project)
    token = "Bearer receiver-token-" + "k" * 24
    url = f"/v1/projects/{project}/subscriptions/s"
    created = await api.client.post(
        f"/v1/projects/{project}/subscriptions",
        json=body(endpoint={"url": HOOK, "headers": {"Authorization": token}}),
    )
    assert created.status_code == 201, created.text
    # When a PUT changes only the endpoint's URL
    moved = await api.client.put(url, json={"version": 1, "endpoint": {"url": moved_to}})
    assert moved.status_code == 200, moved.text
    # Then the token goes with it only to the same origin: another server gets no header
    stored = api.app.state.store.get_subscription(project, "s")
    assert dict(stored.endpoint.headers) == ({"Authorization": token} if kept else {})
    assert moved.json()["endpoint"]["header_names"] == (["Authorization"] if kept else [])
    # And sent again in the same request, they go to the new server
    again = await api.client.put(
        url,
        json={"version": 2, "endpoint": {"url": moved_to, "headers": {"Authorization": token}}},
    )
    assert again.status_code == 200, again.text
    stored = api.app.state.store.get_subscription(project, "s")
    assert dict(stored.endpoint.headers) == {"Authorization": token}


@pytest.mark.parametrize(
    ("changes", "status"),
    [
        ({"topic": "other"}, 400),
        ({"grouped": False}, 400),
        ({"name": "other"}, 400),
        ({"endpoint": {"url": "http://127.0.0.1/x"}}, 400),
        ({"version": 0}, 400),
    ],
)
async def test_put_refuses_what_may_not_change(
    api: Api, project: str, changes: dict[str, Any], status: int
) -> None:
    await make_topic(api, project)
    await api.client.post(f"/v1/projects/{project}/subscriptions", json=body())
    update = {"version": 1, "endpoint": {"url": HOOK}, **changes}
    assert_error(
        await api.client.put(f"/v1/projects/{project}/subscriptions/s", json=update),
        status,
        "invalid_input",
    )


async def test_put_of_an_unknown_subscription_is_404(api: Api, project: str) -> None:
    update = {"version": 1, "endpoint": {"url": HOOK}}
    assert_error(
        await api.client.put(f"/v1/projects/{project}/subscriptions/nope", json=update),
        404,
        "not_found",
    )


async def test_lifecycle_actions_change_the_stored_state(api: Api, project: str) -> None:
    await make_topic(api, project)
    await api.client.post(f"/v1/projects/{project}/subscriptions", json=body())
    base = f"/v1/projects/{project}/subscriptions/s"
    for action, state in [
        ("pause", "paused"),
        ("resume", "running"),
        ("stop", "stopped"),
        ("start", "running"),
    ]:
        response = await api.client.post(f"{base}/{action}")
        assert response.status_code == 200, response.text
        assert response.json()["state"] == state
        assert (await api.client.get(base)).json()["state"] == state
    # A stop with no worker running the subscription is confirmed at once
    stop = (await api.client.post(f"{base}/stop", json={"mode": "forced"})).json()
    assert stop["mode"] == "forced" and stop["confirmed"] is True and stop["workers"] == []
    assert_error(
        await api.client.post(f"{base}/stop", json={"mode": "abrupt"}), 400, "invalid_input"
    )
    assert_error(await api.client.post(f"{base}/resume"), 409, "conflict")
    assert_error(
        await api.client.post(f"/v1/projects/{project}/subscriptions/nope/start"), 404, "not_found"
    )
    assert (await api.client.get(base)).json()["version"] == 1


async def test_every_change_to_a_subscription_tells_the_workers(
    api: Api, project: str, redis_url: str
) -> None:
    # The workers list subscriptions at once when the change count moves, and otherwise only
    # at their backstop listing (docs/delivery.md, "Workers hear of it within a second"): a
    # change that did not raise it reached them half a minute late.
    await make_topic(api, project)
    base = f"/v1/projects/{project}/subscriptions/s"
    redis = aioredis.Redis.from_url(redis_url)

    async def count() -> int:
        return int(await redis.get(keys.subscriptions_changed()) or 0)

    created = await api.client.post(
        f"/v1/projects/{project}/subscriptions", json=body(signing_secret=SECRET)
    )
    [first] = created.json()["signing_secrets"]
    changes: list[tuple[str, str, dict[str, Any] | None]] = [
        ("PUT", base, {"version": 1, "endpoint": {"url": HOOK + "/v2"}}),
        ("POST", base + "/signing-secrets", {"signing_secret": NEXT_SECRET}),
        ("DELETE", f"{base}/signing-secrets/{first['id']}", None),
        ("POST", base + "/pause", None),
        ("POST", base + "/resume", None),
        ("POST", base + "/stop", None),
        ("POST", base + "/seek", {"timestamp_ms": now_ms() - 60_000}),
        ("POST", base + "/start", None),
        ("DELETE", base, None),
    ]
    try:
        for method, url, payload in changes:
            before = await count()
            answer = await api.client.request(method, url, json=payload)
            assert answer.is_success, (method, url, answer.text)
            assert await count() > before, f"{method} {url} did not tell the workers"
    finally:
        await redis.aclose()  # type: ignore[attr-defined]


async def test_delete_removes_topics_and_redis_state(
    api: Api, project: str, redis_url: str
) -> None:
    await make_topic(api, project)
    await api.client.post(f"/v1/projects/{project}/subscriptions", json=body())
    # Given the workers left group state and counters in Redis (and another subscription's key)
    redis = aioredis.Redis.from_url(redis_url)
    ours = [
        keys.group_state(project, "s", "g1"),
        keys.counters(project, "s"),
        keys.failed_groups(project, "s"),
    ]
    theirs = keys.counters(project, "other")
    try:
        for key in [*ours, theirs]:
            await redis.hset(key, "x", "1")
        # When the subscription is deleted
        deleted = await api.client.delete(f"/v1/projects/{project}/subscriptions/s")
        assert deleted.status_code == 204, deleted.text
        # Then its Kafka topics and its keys are gone, and nothing else
        assert await redis.exists(*ours) == 0
        assert await redis.exists(theirs) == 1
    finally:
        await redis.delete(*ours, theirs)
        await redis.aclose()  # type: ignore[attr-defined]
    for name in (retry_topic(project, "s", 1), dlq_topic(project, "s")):
        assert await partitions(api, name) is None
    assert_error(await api.client.get(f"/v1/projects/{project}/subscriptions/s"), 404, "not_found")
    assert_error(
        await api.client.delete(f"/v1/projects/{project}/subscriptions/s"), 404, "not_found"
    )
    # And the topic may now be deleted
    assert (await api.client.delete(f"/v1/projects/{project}/topics/t")).status_code == 204


@pytest.mark.parametrize("secret", ["whsec_", "whsec_abc", "k1", "a-passphrase"])
async def test_a_weak_signing_secret_is_refused(api: Api, project: str, secret: str) -> None:
    # "whsec_" alone gave an empty HMAC key: anyone could forge the signatures
    await make_topic(api, project)
    refused = await api.client.post(
        f"/v1/projects/{project}/subscriptions", json=body(signing_secret=secret)
    )
    assert_error(refused, 400, "invalid_input")
    assert "16 bytes" in refused.json()["error"]["message"]
    listed = await api.client.get(f"/v1/projects/{project}/subscriptions")
    assert listed.json()["subscriptions"] == []


async def answers_for_test_names(host: str, port: int) -> list[str]:
    """A DNS server for the test below: inward names, a name that never answers and one that
    does not exist."""
    if host == "slow.example.net":
        await asyncio.sleep(30)
    answers = {
        "metadata.example.net": ["100.100.100.200"],
        "six.example.net": ["2002:7f00:1::1"],
        "mixed.example.net": ["93.184.215.14", "10.1.2.3"],
        "fine.example.net": ["93.184.215.14"],
    }
    if host not in answers:
        raise OSError(f"{host}: Name or service not known")
    return answers[host]


async def test_names_resolving_inward_late_or_not_at_all_are_refused_at_registration(
    kafka_bootstrap: str, redis_url: str, tmp_path: Path
) -> None:
    async with running_api(
        tmp_path,
        kafka_bootstrap=kafka_bootstrap,
        redis_url=redis_url,
        resolver=answers_for_test_names,
    ) as api:
        project = unique()
        await api.client.post("/v1/projects", json={"name": project})
        try:
            await make_topic(api, project)
            subs = f"/v1/projects/{project}/subscriptions"
            # Given names that resolve inward (in any answer), too late, or not at all
            started = time.monotonic()
            for host, says in (
                ("metadata.example.net", "SETU_ALLOW_PRIVATE_ENDPOINTS"),
                ("six.example.net", "SETU_ALLOW_PRIVATE_ENDPOINTS"),
                ("mixed.example.net", "SETU_ALLOW_PRIVATE_ENDPOINTS"),
                ("slow.example.net", "does not resolve"),
                ("nowhere.example.net", "does not resolve"),
            ):
                # Then each is a 400 saying why, and nothing is created
                response = await api.client.post(
                    subs, json=body(endpoint={"url": f"https://{host}/hook"})
                )
                assert_error(response, 400, "invalid_input")
                assert says in response.json()["error"]["message"], host
            assert time.monotonic() - started < 10  # the slow name was given up after 2 s
            assert (await api.client.get(subs)).json() == {"subscriptions": []}
            assert await partitions(api, dlq_topic(project, "s")) is None
            # And a name with public answers only is accepted
            fine = await api.client.post(
                subs, json=body(endpoint={"url": "https://fine.example.net/hook"})
            )
            assert fine.status_code == 201, fine.text
        finally:
            await drop_project(api.client, project)


@pytest.mark.finding("L8")
async def test_status_read_right_after_a_create_is_answered(api: Api, project: str) -> None:
    # Given subscriptions whose status is asked for the moment each is created, while their
    # new topics' partitions may still be electing leaders
    await make_topic(api, project, partitions=6)
    for n in range(12):
        created = await api.client.post(
            f"/v1/projects/{project}/subscriptions", json=body(name=f"s{n}")
        )
        assert created.status_code == 201, created.text
        # Then the status is there at once, empty: never a 503
        status = await api.client.get(f"/v1/projects/{project}/subscriptions/s{n}/status")
        assert status.status_code == 200, status.text
        assert status.json()["lag"] == 0


async def test_status_says_when_the_ingest_job_has_not_picked_up_the_topic_yet(
    api: Api, project: str, redis_url: str
) -> None:
    # Given a subscription of a new topic, and an ingest job that runs but reads only an
    # older topic so far
    await make_topic(api, project)
    created = await api.client.post(f"/v1/projects/{project}/subscriptions", json=body())
    assert created.status_code == 201, created.text
    status_path = f"/v1/projects/{project}/subscriptions/s/status"
    older = names.ingest_topic(project, "older")
    client = redis.Redis.from_url(redis_url)
    try:
        client.delete(keys.ingest_status())
        job = RedisIngestStatus(client)
        job.write({"state": "running", "at": now_ms(), "reading": json.dumps([older])})
        # Then the status says the job does not read this topic yet, and that messages wait
        ingest = (await api.client.get(status_path)).json()["ingest"]
        assert ingest["reading_topic"] is False
        assert "has not picked up this topic yet" in ingest["error"]
        # When the job picks it up, then the status says so, and nothing is wrong
        mine = names.ingest_topic(project, "t")
        job.write({"at": now_ms(), "reading": json.dumps([older, mine])})
        ingest = (await api.client.get(status_path)).json()["ingest"]
        assert ingest["reading_topic"] is True
        assert ingest.get("error") is None
    finally:
        client.delete(keys.ingest_status())
        client.close()
