"""Per-project produce quotas through the API (docs/security.md §6): 429 with Retry-After,
nothing written, shared by every API replica, set by an admin only."""

from __future__ import annotations

import asyncio
import time

import pytest

from setu.names import ingest_topic
from tests.integration.api.support import (
    Api,
    assert_error,
    drop_project,
    record_count,
    running_api,
    unique,
)

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]


async def make_topic(api: Api, project: str) -> None:
    made = await api.client.post(
        f"/v1/projects/{project}/topics", json={"name": "t", "partitions": 1}
    )
    assert made.status_code == 201, made.text


async def test_a_project_over_its_quota_gets_429_and_nothing_is_written(api: Api) -> None:
    # Given a project limited to 5 messages/s, and another without a quota
    project, free = unique(), unique()
    made = await api.client.post(
        "/v1/projects", json={"name": project, "quota": {"messages_per_second": 5}}
    )
    assert made.json()["quota"] == {"messages_per_second": 5.0, "bytes_per_second": None}
    await api.client.post("/v1/projects", json={"name": free})
    try:
        for p in (project, free):
            await make_topic(api, p)
        url = f"/v1/projects/{project}/topics/t/produce"
        # When it produces 8 messages at once
        started = time.monotonic()
        answers = [
            await api.client.post(url, content=b"x", headers={"X_MESSAGE_ID": f"m{n}"})
            for n in range(8)
        ]
        refilled = int(5 * (time.monotonic() - started))
        # Then a second's worth (5) is accepted, and what refilled meanwhile (a slow machine
        # takes a while for 8 calls); the rest is 429, saying when to retry
        statuses = [a.status_code for a in answers]
        accepted = statuses.count(200)
        assert statuses[:5] == [200] * 5 and 5 <= accepted <= 5 + refilled, statuses
        assert set(statuses) <= {200, 429} and 429 in statuses, statuses
        for refused in [a for a in answers if a.status_code == 429]:
            assert_error(refused, 429, "rate_limited")
            assert int(refused.headers["Retry-After"]) >= 1
            assert "5 messages/s" in refused.json()["error"]["message"]
        # And only the accepted ones reached the ingest log
        ingest = ingest_topic(project, "t")
        written = await asyncio.to_thread(record_count, api.settings.kafka_bootstrap, ingest)
        assert written == accepted
        # And a batch is refused whole, while the other project produces freely
        # (more than a second's worth, so whatever refilled meanwhile cannot cover it)
        batch = await api.client.post(
            url + "/batch",
            json={"messages": [{"message_id": f"b{n}", "body": "x"} for n in range(6)]},
        )
        assert_error(batch, 429, "rate_limited")
        assert await asyncio.to_thread(record_count, api.settings.kafka_bootstrap, ingest) == (
            accepted
        )
        for n in range(20):
            free_answer = await api.client.post(
                f"/v1/projects/{free}/topics/t/produce",
                content=b"x",
                headers={"X_MESSAGE_ID": f"f{n}"},
            )
            assert free_answer.status_code == 200
        # And the throttled messages are counted
        metrics = (await api.client.get("/metrics")).text
        # (without tenant names: SETU_METRICS_TENANT_LABELS is off)
        throttled = 'setu_api_produced_messages_total{outcome="throttled",project="",topic=""}'
        assert throttled in metrics and project not in metrics
    finally:
        await drop_project(api.client, project)
        await drop_project(api.client, free)


async def test_a_bytes_quota_lets_a_big_batch_through_then_makes_the_next_wait(api: Api) -> None:
    project = unique()
    await api.client.post(
        "/v1/projects", json={"name": project, "quota": {"bytes_per_second": 1_000}}
    )
    try:
        await make_topic(api, project)
        url = f"/v1/projects/{project}/topics/t/produce"
        body = {"messages": [{"message_id": f"b{n}", "body": "y" * 1_000} for n in range(3)]}
        # A batch of 3,000 bytes passes on a full bucket, then the debt takes 2 s to pay
        assert (await api.client.post(url + "/batch", json=body)).status_code == 200
        refused = await api.client.post(url, content=b"z", headers={"X_MESSAGE_ID": "z1"})
        assert_error(refused, 429, "rate_limited")
        assert refused.headers["Retry-After"] == "2"
    finally:
        await drop_project(api.client, project)


@pytest.mark.finding("H3")
async def test_a_project_without_a_quota_may_send_8_mib_a_second_by_default(
    kafka_bootstrap: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # Given an API with the default settings and a project that sets no quota (H3: one
    # producer's unlimited burst once held up ingest for every project)
    async with running_api(
        tmp_path_factory.mktemp("defaults"), kafka_bootstrap=kafka_bootstrap, redis_url=redis_url
    ) as api:
        project = unique()
        await api.client.post("/v1/projects", json={"name": project})
        try:
            await make_topic(api, project)
            url = f"/v1/projects/{project}/topics/t/produce"
            # When it sends 30 MB at once: a full bucket lets a batch over a second's worth
            # pass, and leaves a debt of 2.6 s (far longer than writing the batch takes)
            chunk = "y" * 1_000_000
            body = {"messages": [{"message_id": f"b{n}", "body": chunk} for n in range(30)]}
            sent = await api.client.post(url + "/batch", json=body)
            assert sent.status_code == 200, sent.text
            # Then the next message waits out the debt, told the default it met
            refused = await api.client.post(url, content=b"z", headers={"X_MESSAGE_ID": "z1"})
            assert_error(refused, 429, "rate_limited")
            assert "8.38861e+06 bytes/s" in refused.json()["error"]["message"]
            assert int(refused.headers["Retry-After"]) >= 1
        finally:
            await drop_project(api.client, project)


async def test_only_an_admin_sets_a_quota_and_replicas_share_it(
    api: Api, kafka_bootstrap: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    project = unique()
    await api.client.post("/v1/projects", json={"name": project})
    try:
        await make_topic(api, project)
        # An owner of the project may not raise its quota
        key = await api.client.post(
            f"/v1/projects/{project}/keys", json={"name": "o", "role": "owner"}
        )
        owner = {"Authorization": f"Bearer {key.json()['key']}"}
        quota_url = f"/v1/projects/{project}/quota"
        denied = await api.client.put(quota_url, json={"messages_per_second": 1e6}, headers=owner)
        assert_error(denied, 403, "forbidden")
        for bad in (
            {"messages_per_second": 0},
            {"bytes_per_second": -1},
            {"bytes_per_second": 1e-300},  # (found by the fuzzing: it broke the arithmetic)
            {"other": 1},
        ):
            assert_error(await api.client.put(quota_url, json=bad), 400, "invalid_input")
        # The admin sets 6 messages/s
        set_quota = await api.client.put(quota_url, json={"messages_per_second": 6})
        assert set_quota.status_code == 200, set_quota.text
        assert set_quota.json()["quota"]["messages_per_second"] == 6.0
        # Then a second API on the same database and Redis shares the same 6 per second
        # (its quota cache reads the store, so it needs no restart either)
        async with running_api(
            tmp_path_factory.mktemp("second"),
            kafka_bootstrap=kafka_bootstrap,
            redis_url=redis_url,
            database_url=api.settings.resolved_database_url(),
        ) as second:
            statuses = []
            started = time.monotonic()
            for n in range(12):
                replica = (api, second)[n % 2]
                answer = await replica.client.post(
                    f"/v1/projects/{project}/topics/t/produce",
                    content=b"x",
                    headers={"X_MESSAGE_ID": f"m{n}"},
                )
                statuses.append(answer.status_code)
            refilled = int(6 * (time.monotonic() - started))
        # (6, and what refilled while the requests ran; not 6 for each replica)
        assert statuses.count(200) == 6 + refilled, statuses
    finally:
        await drop_project(api.client, project)
