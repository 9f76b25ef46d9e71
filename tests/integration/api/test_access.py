"""Every route, every caller: the status docs/design.md §8 implies, and nothing changed by a
refusal (docs/security.md).

The expected rules below are written from §8's table, not read from the code: a route the
application has and this table does not (a new route) fails the first test, and a route whose
rule drifts from §8 fails the second.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import pytest_asyncio
from confluent_kafka import Consumer, TopicPartition
from fastapi.routing import APIRoute

from api.app import ROUTERS
from setu import names
from setu.access import ApiKey, Role, digest, new_token
from setu.clock import now_ms
from state.metadata import MetadataStore
from tests.integration.api.support import Api, drop_project, running_api, unique

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

EVERYONE = {"admin", "owner", "operator", "producer", "viewer"}
ADMIN = {"admin"}
MANAGE = {"admin", "owner"}
OPERATE = {"admin", "owner", "operator"}
READ = {"admin", "owner", "operator", "viewer"}
PRODUCE = {"admin", "owner", "producer"}
READ_PRODUCER = EVERYONE

P = "/v1/projects/{project}"
S = P + "/subscriptions/{subscription}"

# (method, route) -> the roles of the route's project that may call it (§8).
EXPECTED: dict[tuple[str, str], set[str]] = {
    ("POST", "/v1/projects"): ADMIN,
    ("GET", "/v1/projects"): EVERYONE,  # each key sees its own project
    ("GET", P): READ,
    ("DELETE", P): ADMIN,
    ("PUT", P + "/quota"): ADMIN,  # a project's owner must not raise its own quota
    ("PUT", P + "/notifications"): MANAGE,
    ("GET", P + "/notifications"): READ,
    ("DELETE", P + "/notifications"): MANAGE,
    ("POST", P + "/filters/test"): READ,  # judges a sample the caller gives; reads nothing
    ("POST", "/v1/keys"): ADMIN,
    ("GET", "/v1/keys"): ADMIN,
    ("DELETE", "/v1/keys/{key_id}"): ADMIN,
    ("POST", P + "/keys"): MANAGE,
    ("GET", P + "/keys"): OPERATE,  # the operator reads everything of the project
    ("DELETE", P + "/keys/{key_id}"): MANAGE,
    ("POST", P + "/topics"): MANAGE,
    ("GET", P + "/topics"): READ,
    ("GET", P + "/topics/{topic}"): READ,
    ("DELETE", P + "/topics/{topic}"): MANAGE,
    ("GET", P + "/topics/{topic}/producers/{producer_id}"): READ_PRODUCER,
    ("POST", P + "/topics/{topic}/produce"): PRODUCE,
    ("POST", P + "/topics/{topic}/produce/batch"): PRODUCE,
    # A producer takes back what it scheduled (docs/scheduling.md)
    ("POST", P + "/topics/{topic}/messages/{message_id}/cancel"): PRODUCE,
    ("POST", P + "/subscriptions"): MANAGE,
    ("GET", P + "/subscriptions"): READ,
    ("GET", S): READ,
    ("PUT", S): MANAGE,
    ("DELETE", S): MANAGE,
    ("POST", S + "/signing-secrets"): MANAGE,  # a secret is part of the configuration
    ("DELETE", S + "/signing-secrets/{secret_id}"): MANAGE,
    ("POST", S + "/start"): OPERATE,
    ("POST", S + "/stop"): OPERATE,
    ("POST", S + "/pause"): OPERATE,
    ("POST", S + "/resume"): OPERATE,
    ("GET", S + "/status"): READ,
    ("GET", S + "/groups"): READ,
    ("GET", S + "/messages/{message_id}"): READ,
    ("GET", S + "/groups/{group_id}"): READ,
    ("GET", S + "/dlq/messages"): OPERATE,  # message bodies: not the viewer
    ("POST", S + "/dlq/unsideline"): OPERATE,
    ("POST", S + "/seek"): OPERATE,
    ("POST", S + "/replays"): OPERATE,
    ("GET", S + "/replays"): READ,
    ("GET", S + "/replays/{replay_id}"): READ,
    ("POST", S + "/replays/{replay_id}/cancel"): OPERATE,
}
PUBLIC = {("GET", "/v1/health"), ("GET", "/metrics")}

HOOK = "https://hooks.example.com/orders"


def app_routes() -> set[tuple[str, str]]:
    """Every (method, path) the application serves, from its routers' own tables."""
    found = set()
    for module in ROUTERS:
        for route in module.router.routes:
            assert isinstance(route, APIRoute)
            for method in route.methods - {"HEAD"}:
                found.add((method, route.path))
    return found


async def test_every_route_has_a_rule_in_this_table() -> None:
    assert app_routes() == set(EXPECTED) | PUBLIC


@dataclass
class World:
    api: Api
    project: str
    other: str
    topic: str
    subscription: str
    tokens: dict[str, str | None]


def stored_key(
    store: MetadataStore,
    role: Role,
    project: str | None,
    topics: tuple[str, ...] | None = None,
    created_at_ms: int | None = None,
    expires_at_ms: int | None = None,
) -> tuple[str, str]:
    """A key written straight to the store: its id and token."""
    key_id, token = new_token()
    created = now_ms() if created_at_ms is None else created_at_ms
    key = ApiKey(key_id, f"{role}-key", role, project, topics, digest(token), created)
    store.keys.create(dataclasses.replace(key, expires_at_ms=expires_at_ms))
    return key_id, token


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def world(
    kafka_bootstrap: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[World]:
    async with running_api(
        tmp_path_factory.mktemp("access"),
        kafka_bootstrap=kafka_bootstrap,
        redis_url=redis_url,
        allow_private_endpoints=True,
    ) as api:
        project, other = unique(), unique()
        for name in (project, other):
            assert (await api.client.post("/v1/projects", json={"name": name})).status_code == 201
        url = f"/v1/projects/{project}"
        assert (await api.client.post(url + "/topics", json={"name": "t"})).status_code == 201
        sub = {"name": "s", "topic": "t", "endpoint": {"url": HOOK}}
        assert (await api.client.post(url + "/subscriptions", json=sub)).status_code == 201
        store: MetadataStore = api.app.state.store
        tokens: dict[str, str | None] = {
            role.value: stored_key(store, role, None if role is Role.ADMIN else project)[1]
            for role in Role
        }
        tokens["producer of another topic"] = stored_key(
            store, Role.PRODUCER, project, topics=("other",)
        )[1]
        tokens["owner of another project"] = stored_key(store, Role.OWNER, other)[1]
        revoked_id, tokens["revoked key"] = stored_key(store, Role.OWNER, project)
        store.keys.revoke(revoked_id)
        tokens["expired key"] = stored_key(
            store,
            Role.OWNER,
            project,
            created_at_ms=now_ms() - 10_000,
            expires_at_ms=now_ms() - 1,
        )[1]
        tokens["unknown key"] = new_token()[1]
        tokens["not a key"] = "hunter2"
        tokens["no key"] = None
        yield World(api, project, other, "t", "s", tokens)
        await drop_project(api.client, project)
        await drop_project(api.client, other)


def expected_status(caller: str, method: str, route: str) -> int | None:
    """401 or 403 when ``caller`` must be refused; None when it may call the route."""
    if caller in ("revoked key", "expired key", "unknown key", "not a key", "no key"):
        return 401
    allowed = EXPECTED[(method, route)]
    if caller == "owner of another project":
        if route == "/v1/projects":
            return None if method == "GET" else 403
        return 403 if route.startswith(P) or allowed == ADMIN else None
    if caller == "producer of another topic":
        if route.endswith(("/produce", "/produce/batch", "/cancel")) and "/topics/" in route:
            return 403  # the key's topics only
        caller = "producer"
    return None if caller in allowed else 403


def request_for(w: World, method: str, route: str) -> dict[str, Any]:
    """A request that would change something if it were let through: valid bodies, real
    names (deletes aim at names that do not exist, so an allowed one changes nothing)."""
    ghost = "ghost-" + uuid.uuid4().hex[:6]
    deleting = method == "DELETE"
    path = route.format(
        project=w.project,
        topic=ghost if deleting else w.topic,
        subscription=ghost if deleting else w.subscription,
        group_id="g1",
        producer_id="prod-1",
        key_id="0123456789abcdef",
        secret_id="ss_ghost",
        message_id="m-1",
        replay_id="rp_ghost",
    )
    bodies: dict[str, Any] = {
        "/v1/projects": {"name": unique()},
        P + "/quota": {"messages_per_second": 5},
        P + "/notifications": {"url": HOOK, "events": ["group.parked"]},
        P + "/filters/test": {"filter": {"body": "a", "exists": True}, "body": '{"a": 1}'},
        "/v1/keys": {"name": "k", "role": "viewer", "project": w.project},
        P + "/keys": {"name": "k", "role": "viewer"},
        P + "/topics": {"name": unique("t")},
        P + "/topics/{topic}/produce/batch": {"messages": [{"message_id": "m", "body": "x"}]},
        P + "/subscriptions": {"name": unique("s"), "topic": w.topic, "endpoint": {"url": HOOK}},
        S: {"topic": w.topic, "endpoint": {"url": HOOK}, "version": 1, "max_in_flight": 7},
        S + "/dlq/unsideline": {"group_ids": ["g1"]},
        S + "/seek": {"timestamp_ms": 0},
        S + "/replays": {"from_ms": 0},
        S + "/signing-secrets": {"signing_secret": "whsec_" + "QUJDREVGR0hJSktMTU5PUFFSU1RVVldY"},
    }
    out: dict[str, Any] = {"method": method, "url": path}
    if route.endswith("/produce"):
        out.update(content=b"x", headers={"X_MESSAGE_ID": "m-1"})
    elif route in bodies and method in ("POST", "PUT"):
        out["json"] = bodies[route]
    return out


async def snapshot(w: World, bootstrap: str) -> dict[str, Any]:
    """What a refused request must not change: the rows, the keys, the topic's messages."""
    store: MetadataStore = w.api.app.state.store
    ingest = names.ingest_topic(w.project, w.topic)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "access-snapshot"})
    try:
        ends = [
            consumer.get_watermark_offsets(TopicPartition(ingest, p), timeout=10)[1]
            for p in range(6)
        ]
    finally:
        consumer.close()
    return {
        "projects": store.list_projects(),
        "topics": store.list_topics(w.project),
        "subscriptions": store.list_subscriptions(w.project),
        "notifications": store.list_notifications(),
        # (last use is written in the background, when a key is first seen: not a change)
        "keys": [dataclasses.replace(k, last_used_at_ms=None) for k in store.keys.list()],
        "replays": store.replays.listed(w.project, w.subscription, 100),
        "cancelled": store.schedule_cancels.cancelled(w.project, w.topic, ["m-1"]),
        "ingest": ends,
    }


CALLERS = [
    "admin",
    "owner",
    "operator",
    "producer",
    "viewer",
    "producer of another topic",
    "owner of another project",
    "revoked key",
    "expired key",
    "unknown key",
    "not a key",
    "no key",
]


@pytest.mark.parametrize("caller", CALLERS)
async def test_every_route_answers_each_caller_as_the_roles_table_says(
    world: World, kafka_bootstrap: str, caller: str
) -> None:
    token = world.tokens[caller]
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    transport = httpx.ASGITransport(app=world.api.app)
    async with httpx.AsyncClient(transport=transport, base_url="http://setu") as client:
        for method, route in sorted(EXPECTED):
            expected = expected_status(caller, method, route)
            request = request_for(world, method, route)
            request["headers"] = {**headers, **request.get("headers", {})}
            before = await snapshot(world, kafka_bootstrap) if expected else None
            response = await client.request(**request)
            where = f"{caller}: {method} {route} -> {response.status_code} {response.text}"
            if expected is None:
                assert response.status_code not in (401, 403), where
                continue
            assert response.status_code == expected, where
            if token is not None:
                assert token not in response.text, where
            body = response.json()
            assert set(body) == {"error"}, where
            assert body["error"]["code"] == ("unauthorized" if expected == 401 else "forbidden")
            if expected == 401:
                assert response.headers["www-authenticate"] == "Bearer", where
            assert await snapshot(world, kafka_bootstrap) == before, where


async def test_health_needs_no_key(world: World) -> None:
    transport = httpx.ASGITransport(app=world.api.app)
    async with httpx.AsyncClient(transport=transport, base_url="http://setu") as client:
        response = await client.get("/v1/health")
    # (503 when the ingest job is not running here: still answered, with every component)
    assert response.status_code in (200, 503)
    assert {"kafka", "redis", "database"} <= set(response.json()["components"])
