"""API keys through the HTTP API: shown once, listed without secrets, scoped, revoked on every
replica within seconds, expiring (docs/security.md)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import pytest_asyncio

from tests.integration.api.support import Api, assert_error, drop_project, running_api, unique
from tests.waiting import wait_for_async

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

# docs/design.md §8: a revocation holds on every API replica within 5 s.
REVOCATION_S = 5.0


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def replicas(
    kafka_bootstrap: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[tuple[Api, Api]]:
    """Two API processes' apps on one metadata database."""
    data: Path = tmp_path_factory.mktemp("keys")
    settings = {"kafka_bootstrap": kafka_bootstrap, "redis_url": redis_url}
    async with running_api(data, **settings) as one, running_api(data, **settings) as two:
        yield one, two


@pytest_asyncio.fixture(loop_scope="module")
async def project(replicas: tuple[Api, Api]) -> AsyncIterator[str]:
    api = replicas[0]
    name = unique()
    assert (await api.client.post("/v1/projects", json={"name": name})).status_code == 201
    yield name
    await drop_project(api.client, name)


def as_key(api: Api, token: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=api.app),
        base_url="http://setu",
        headers={"Authorization": f"Bearer {token}"},
    )


async def test_a_key_is_shown_once_and_listed_without_its_secret(
    replicas: tuple[Api, Api], project: str
) -> None:
    api = replicas[0]
    created = await api.client.post(
        f"/v1/projects/{project}/keys", json={"name": "orders-service", "role": "producer"}
    )
    assert created.status_code == 201, created.text
    key = created.json()
    assert key["key"].startswith("setu_") and key["role"] == "producer"
    assert key["project"] == project and key["last_used_at_ms"] is None
    listed = await api.client.get(f"/v1/projects/{project}/keys")
    assert listed.status_code == 200
    (entry,) = listed.json()["keys"]
    assert entry["id"] == key["id"] and "key" not in entry
    assert key["key"] not in listed.text
    # When the key is used, then its last use is recorded
    async with as_key(api, key["key"]) as client:
        produced = await client.post(
            f"/v1/projects/{project}/topics/none/produce",
            content=b"x",
            headers={"X_MESSAGE_ID": "m"},
        )
        assert produced.status_code == 404  # allowed, but there is no such topic

    async def used() -> bool:
        found = (await api.client.get(f"/v1/projects/{project}/keys")).json()["keys"]
        return bool(found[0]["last_used_at_ms"])

    await wait_for_async("the key's last use recorded", used, 10)


async def test_a_revoked_key_is_refused_by_every_replica_within_five_seconds(
    replicas: tuple[Api, Api], project: str
) -> None:
    one, two = replicas
    created = await one.client.post(
        f"/v1/projects/{project}/keys", json={"name": "reader", "role": "viewer"}
    )
    token, key_id = created.json()["key"], created.json()["id"]
    async with as_key(one, token) as on_one, as_key(two, token) as on_two:
        # Given the key in use on both replicas (so both have it in memory)
        for client in (on_one, on_two):
            assert (await client.get(f"/v1/projects/{project}/topics")).status_code == 200
        # When it is revoked through the first one
        revoked = await one.client.delete(f"/v1/projects/{project}/keys/{key_id}")
        assert revoked.status_code == 204
        # Then the first refuses it at once, the second within 5 s
        assert_error(await on_one.get(f"/v1/projects/{project}/topics"), 401, "unauthorized")

        async def refused() -> bool:
            response = await on_two.get(f"/v1/projects/{project}/topics")
            return response.status_code == 401

        await wait_for_async("the other replica refusing the revoked key", refused, REVOCATION_S)
    listed = (await one.client.get(f"/v1/projects/{project}/keys")).json()["keys"]
    assert key_id not in [k["id"] for k in listed]
    assert_error(await one.client.delete(f"/v1/projects/{project}/keys/{key_id}"), 404, "not_found")


async def test_a_key_stops_working_when_it_expires(replicas: tuple[Api, Api], project: str) -> None:
    api = replicas[0]
    expires = int(time.time() * 1000) + 1_500
    created = await api.client.post(
        f"/v1/projects/{project}/keys",
        json={"name": "short", "role": "viewer", "expires_at_ms": expires},
    )
    assert created.status_code == 201
    async with as_key(api, created.json()["key"]) as client:
        assert (await client.get(f"/v1/projects/{project}")).status_code == 200

        async def refused() -> bool:
            response = await client.get(f"/v1/projects/{project}")
            return response.status_code == 401

        await wait_for_async("the expired key refused", refused, 10)
    assert time.time() * 1000 >= expires


async def test_keys_of_a_project_cannot_reach_further(
    replicas: tuple[Api, Api], project: str
) -> None:
    api = replicas[0]
    url = f"/v1/projects/{project}/keys"
    # An owner cannot mint an admin key, nor a key of another project
    assert_error(
        await api.client.post(url, json={"name": "x", "role": "admin"}), 400, "invalid_input"
    )
    owner = (await api.client.post(url, json={"name": "o", "role": "owner"})).json()["key"]
    async with as_key(api, owner) as client:
        other = {"name": "x", "role": "viewer", "project": "elsewhere"}
        assert_error(await client.post("/v1/keys", json=other), 403, "forbidden")
        assert_error(await client.get("/v1/keys"), 403, "forbidden")
        # and sees only its own project in the list
        listed = (await client.get("/v1/projects")).json()["projects"]
        assert [p["name"] for p in listed] == [project]
    # Topics are for producer keys only; an admin key has no project; others need one
    bad = [
        (url, {"name": "x", "role": "viewer", "topics": ["t"]}),
        (url, {"name": "x", "role": "viewer", "expires_at_ms": 1}),
        (url, {"name": " x", "role": "viewer"}),
        (url, {"name": "x\n", "role": "viewer"}),
        ("/v1/keys", {"name": "x", "role": "admin", "project": project}),
        ("/v1/keys", {"name": "x", "role": "viewer"}),
    ]
    for where, body in bad:
        assert_error(await api.client.post(where, json=body), 400, "invalid_input")
    assert_error(
        await api.client.post(
            "/v1/keys", json={"name": "x", "role": "viewer", "project": unique()}
        ),
        404,
        "not_found",
    )
    assert len((await api.client.get(url)).json()["keys"]) == 1  # the owner key only


async def test_deleting_a_project_revokes_its_keys(replicas: tuple[Api, Api]) -> None:
    api = replicas[0]
    name = unique()
    await api.client.post("/v1/projects", json={"name": name})
    token = (
        await api.client.post(f"/v1/projects/{name}/keys", json={"name": "o", "role": "owner"})
    ).json()["key"]
    assert (await api.client.delete(f"/v1/projects/{name}")).status_code == 204
    await api.client.post("/v1/projects", json={"name": name})
    try:
        async with as_key(api, token) as client:

            async def refused() -> bool:
                return (await client.get(f"/v1/projects/{name}")).status_code == 401

            await wait_for_async("the deleted project's key refused", refused, REVOCATION_S)
    finally:
        await api.client.delete(f"/v1/projects/{name}")
