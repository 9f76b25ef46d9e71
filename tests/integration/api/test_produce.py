"""Produce through the HTTP API: records land in the ingest topic with their headers, on the
murmur2 partition of their GroupId; every refusal writes nothing."""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path

import pytest

from setu.names import ingest_topic
from setu.partitioner import partition_for
from tests.integration.api.support import (
    MAX_MESSAGE_BYTES,
    Api,
    assert_error,
    drop_project,
    headers_of,
    read_records,
    record_count,
    running_api,
    unique,
)

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

PARTITIONS = 6


async def make_topic(api: Api, project: str, name: str = "t", grouped: bool = True) -> str:
    created = await api.client.post(
        f"/v1/projects/{project}/topics",
        json={"name": name, "grouped": grouped, "partitions": PARTITIONS},
    )
    assert created.status_code == 201, created.text
    return f"/v1/projects/{project}/topics/{name}/produce"


async def records(api: Api, project: str, count: int, topic: str = "t") -> list:  # type: ignore[type-arg]
    bootstrap = api.settings.kafka_bootstrap
    assert bootstrap is not None
    return await asyncio.to_thread(read_records, bootstrap, ingest_topic(project, topic), count)


async def written(api: Api, project: str, topic: str = "t") -> int:
    bootstrap = api.settings.kafka_bootstrap
    assert bootstrap is not None
    return await asyncio.to_thread(record_count, bootstrap, ingest_topic(project, topic))


@pytest.mark.parametrize("sep", ["_", "-"])
async def test_message_lands_on_its_groups_murmur2_partition_with_headers(
    api: Api, project: str, sep: str
) -> None:
    url = await make_topic(api, project)
    headers = {
        f"X{sep}MESSAGE{sep}ID": "m-1",
        f"X{sep}GROUP{sep}ID": "order-42",
        f"X{sep}PRODUCER{sep}ID": "shop",
        f"X{sep}SEQUENCE{sep}ID": "7",
        f"X{sep}TRACE": "abc",
        "Content-Type": "application/vnd.shop+cbor",
    }
    body = bytes(range(256))  # any bytes, not only text
    response = await api.client.post(url, content=body, headers=headers)
    assert response.status_code == 200, response.text
    assert response.json() == {"message_id": "m-1"}
    [record] = await records(api, project, 1)
    assert record.partition() == partition_for(b"order-42", PARTITIONS)
    assert record.key() == b"order-42"
    assert record.value() == body
    got = headers_of(record)
    assert got["setu-message-id"] == b"m-1"
    assert got["setu-group-id"] == b"order-42"
    assert got["setu-producer-id"] == b"shop"
    assert got["setu-sequence-id"] == b"7"
    assert int(got["setu-produced-at"]) > 0
    assert got[f"x{sep}trace"] == b"abc"
    # The producer's Content-Type travels under Setu's name, for the webhook call.
    assert got["setu-content-type"] == b"application/vnd.shop+cbor"
    assert "content-type" not in got


async def test_a_message_without_a_producer_id_carries_its_topics_window(
    api: Api, project: str
) -> None:
    created = await api.client.post(
        f"/v1/projects/{project}/topics",
        json={"name": "w", "partitions": 1, "dedup_window_seconds": 60},
    )
    assert created.status_code == 201, created.text
    url = f"/v1/projects/{project}/topics/w/produce"
    plain = {"X-Message-Id": "m-1"}
    sequenced = {"X-Message-Id": "m-2", "X-Producer-Id": "p", "X-Sequence-Id": "1"}
    for headers in (plain, sequenced):
        assert (await api.client.post(url, content=b"x", headers=headers)).status_code == 200
    first, second = await records(api, project, 2, topic="w")
    # The ingest job de-duplicates the first by message id within 60 s, in the topic's life
    assert headers_of(first)["setu-dedup-window-ms"] == b"60000"
    assert (
        headers_of(first)["setu-topic-incarnation"] == str(created.json()["created_at_ms"]).encode()
    )
    # and the second by its producer's sequence, with no window
    assert "setu-dedup-window-ms" not in headers_of(second)


async def test_every_message_of_a_group_shares_one_partition(api: Api, project: str) -> None:
    url = await make_topic(api, project)
    groups = [f"g{i}" for i in range(12)]
    for group in groups:
        for n in range(2):
            headers = {"X-Message-Id": f"{group}-{n}", "X-Group-Id": group}
            assert (await api.client.post(url, content=b"x", headers=headers)).status_code == 200
    found = await records(api, project, len(groups) * 2)
    assert len(found) == len(groups) * 2
    for record in found:
        group = headers_of(record)["setu-group-id"]
        assert record.partition() == partition_for(group, PARTITIONS)


async def test_ungrouped_message_is_keyed_by_its_message_id(api: Api, project: str) -> None:
    url = await make_topic(api, project, grouped=False)
    assert (
        await api.client.post(url, content=b"", headers={"x_message_id": "solo"})
    ).status_code == 200
    [record] = await records(api, project, 1)
    assert record.key() == b"solo"
    assert record.partition() == partition_for(b"solo", PARTITIONS)
    assert record.value() in (b"", None)


@pytest.mark.parametrize(
    ("headers", "needle"),
    [
        ({"X-Message-Id": "m"}, "X_GROUP_ID is required"),
        ({"X-Group-Id": "g"}, "X_MESSAGE_ID is required"),
        ({"X-Message-Id": "m" * 101, "X-Group-Id": "g"}, "at most 100"),
        ({"X-Message-Id": "m", "X-Group-Id": "g", "X-Producer-Id": "p"}, "go together"),
        (
            {"X-Message-Id": "m", "X-Group-Id": "g", "X-Producer-Id": "p", "X-Sequence-Id": "-1"},
            "0..",
        ),
        ({"X-Message-Id": "m", "X-Group-Id": "g", "X-Delivery-Attempt": "2"}, "set by Setu"),
    ],
)
async def test_header_rule_breaks_are_400_and_write_nothing(
    api: Api, project: str, headers: dict[str, str], needle: str
) -> None:
    url = await make_topic(api, project)
    response = await api.client.post(url, content=b"x", headers=headers)
    assert_error(response, 400, "invalid_input")
    assert needle in response.json()["error"]["message"]
    assert await written(api, project) == 0


async def test_body_over_the_limit_is_413_and_at_the_limit_is_fine(api: Api, project: str) -> None:
    url = await make_topic(api, project)
    headers = {"X-Message-Id": "m", "X-Group-Id": "g"}
    assert_error(
        await api.client.post(url, content=b"x" * (MAX_MESSAGE_BYTES + 1), headers=headers),
        413,
        "payload_too_large",
    )

    # A streamed body without Content-Length is cut off the same way
    async def stream():  # type: ignore[no-untyped-def]
        for _ in range(3):
            yield b"x" * (MAX_MESSAGE_BYTES // 2)

    assert_error(
        await api.client.post(url, content=stream(), headers=headers), 413, "payload_too_large"
    )
    assert await written(api, project) == 0
    ok = await api.client.post(url, content=b"x" * MAX_MESSAGE_BYTES, headers=headers)
    assert ok.status_code == 200, ok.text
    [record] = await records(api, project, 1)
    assert len(record.value()) == MAX_MESSAGE_BYTES


async def test_unknown_topic_or_project_is_404(api: Api, project: str) -> None:
    headers = {"X-Message-Id": "m"}
    for url in (
        f"/v1/projects/{project}/topics/nope/produce",
        "/v1/projects/nope-nope/topics/t/produce",
    ):
        assert_error(await api.client.post(url, content=b"x", headers=headers), 404, "not_found")
        assert_error(await api.client.post(url + "/batch", json={"messages": []}), 404, "not_found")


async def test_topic_created_after_a_404_is_producible_at_once(api: Api, project: str) -> None:
    url = f"/v1/projects/{project}/topics/late/produce"
    assert_error(
        await api.client.post(url, content=b"x", headers={"X-Message-Id": "m"}), 404, "not_found"
    )
    await make_topic(api, project, name="late", grouped=False)
    assert (
        await api.client.post(url, content=b"x", headers={"X-Message-Id": "m"})
    ).status_code == 200


async def test_batch_lands_in_order_with_per_message_results(api: Api, project: str) -> None:
    url = await make_topic(api, project) + "/batch"
    messages = [
        {"message_id": f"m{i}", "group_id": "g", "body": f"body {i}", "headers": {"X-N": str(i)}}
        for i in range(20)
    ]
    messages.append(
        {
            "message_id": "bin",
            "group_id": "g",
            "body_base64": base64.b64encode(b"\x00\xff").decode(),
        }
    )
    response = await api.client.post(url, json={"messages": messages})
    assert response.status_code == 200, response.text
    assert response.json()["results"] == [
        {"message_id": m["message_id"], "status": "ok"} for m in messages
    ]
    found = await records(api, project, len(messages))
    # One group: one partition, in the order of the batch
    assert [headers_of(r)["setu-message-id"].decode() for r in found] == [
        m["message_id"] for m in messages
    ]
    assert {r.partition() for r in found} == {partition_for(b"g", PARTITIONS)}
    assert found[3].value() == b"body 3" and headers_of(found[3])["X-N"] == b"3"
    assert found[-1].value() == b"\x00\xff"


async def test_batch_with_one_bad_message_is_400_and_writes_nothing(api: Api, project: str) -> None:
    url = await make_topic(api, project) + "/batch"
    messages = [{"message_id": f"m{i}", "group_id": "g", "body": "x"} for i in range(5)]
    messages[3] = {"message_id": "m3", "body": "no group"}
    response = await api.client.post(url, json={"messages": messages})
    assert_error(response, 400, "invalid_input")
    assert response.json()["error"]["message"].startswith("messages[3]:")
    assert await written(api, project) == 0


async def test_batch_limits_are_413(api: Api, project: str) -> None:
    url = await make_topic(api, project) + "/batch"
    many = [{"message_id": f"m{i}", "group_id": "g", "body": ""} for i in range(51)]
    assert_error(await api.client.post(url, json={"messages": many}), 413, "payload_too_large")
    big = [{"message_id": "m", "group_id": "g", "body": "x" * (MAX_MESSAGE_BYTES + 1)}]
    assert_error(await api.client.post(url, json={"messages": big}), 413, "payload_too_large")
    whole = [{"message_id": f"m{i}", "group_id": "g", "body": "x" * 60_000} for i in range(10)]
    assert_error(await api.client.post(url, json={"messages": whole}), 413, "payload_too_large")
    assert await written(api, project) == 0


@pytest.mark.finding("L2")
@pytest.mark.parametrize("tenant_labels", [False, True])
async def test_produce_is_counted_in_metrics_naming_tenants_only_when_asked(
    kafka_bootstrap: str, redis_url: str, tmp_path: Path, tenant_labels: bool
) -> None:
    # Given an API whose /metrics (which needs no key) may or may not name projects
    async with running_api(
        tmp_path,
        kafka_bootstrap=kafka_bootstrap,
        redis_url=redis_url,
        metrics_tenant_labels=tenant_labels,
    ) as api:
        project = unique()
        assert (await api.client.post("/v1/projects", json={"name": project})).status_code == 201
        try:
            url = await make_topic(api, project)
            # When a message is accepted and another refused
            headers = {"X-Message-Id": "m", "X-Group-Id": "g"}
            await api.client.post(url, content=b"x", headers=headers)
            await api.client.post(url, content=b"x", headers={"X-Message-Id": "m"})
            text = (await api.client.get("/metrics", headers={"Authorization": ""})).text
        finally:
            await drop_project(api.client, project)
    # Then both are counted, by project and topic only where that was asked for
    labels = f'project="{project}",topic="t"' if tenant_labels else 'project="",topic=""'
    assert f'setu_api_produced_messages_total{{outcome="ok",{labels}}} 1.0' in text
    assert f'setu_api_produced_messages_total{{outcome="rejected",{labels}}} 1.0' in text
    assert (project in text) is tenant_labels
    assert 'route="/v1/projects/{project}/topics/{topic}/produce"' in text
    assert "setu_api_produce_ack_seconds_bucket" in text


async def test_routed_produce_behaves_like_the_fast_path(
    kafka_bootstrap: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # Given an app whose produce requests go through FastAPI's router
    async with running_api(
        tmp_path_factory.mktemp("routed"),
        fast_path=False,
        kafka_bootstrap=kafka_bootstrap,
        redis_url=redis_url,
    ) as routed:
        project = unique()
        await routed.client.post("/v1/projects", json={"name": project})
        try:
            url = await make_topic(routed, project)
            headers = {"X-Message-Id": "m1", "X-Group-Id": "g"}
            # Then single and batch produce answer as they do on the fast path
            ok = await routed.client.post(url, content=b"body", headers=headers)
            assert (ok.status_code, ok.json()) == (200, {"message_id": "m1"})
            bad = await routed.client.post(url, content=b"body", headers={"X-Message-Id": "m"})
            assert_error(bad, 400, "invalid_input")
            batch = await routed.client.post(
                url + "/batch",
                json={"messages": [{"message_id": "m2", "group_id": "g", "body": "b"}]},
            )
            assert batch.json() == {"results": [{"message_id": "m2", "status": "ok"}]}
            assert len(await records(routed, project, 2)) == 2
        finally:
            await drop_project(routed.client, project)
