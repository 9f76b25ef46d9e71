"""Projects and topics through the HTTP API, with their Kafka topics on the real broker."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from setu.names import groups_topic, ingest_rejects_topic, ingest_topic, main_topic
from state import keys
from tests.integration.api.support import Api, assert_error, unique

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]


async def partitions(api: Api, kafka_topic: str) -> int | None:
    admin = api.app.state.kafka_admin
    return await asyncio.to_thread(admin.partition_count, kafka_topic)


async def test_project_create_read_list_delete(api: Api) -> None:
    name = unique()
    created = await api.client.post("/v1/projects", json={"name": name, "description": "shop"})
    assert created.status_code == 201
    assert created.json()["description"] == "shop"
    # The same body again is fine; a different one conflicts
    assert (
        await api.client.post("/v1/projects", json={"name": name, "description": "shop"})
    ).status_code == 200
    assert_error(await api.client.post("/v1/projects", json={"name": name}), 409, "conflict")
    assert (await api.client.get(f"/v1/projects/{name}")).json()["name"] == name
    listed = (await api.client.get("/v1/projects")).json()["projects"]
    assert name in {p["name"] for p in listed}
    assert (await api.client.delete(f"/v1/projects/{name}")).status_code == 204
    assert_error(await api.client.get(f"/v1/projects/{name}"), 404, "not_found")
    assert_error(await api.client.delete(f"/v1/projects/{name}"), 404, "not_found")


@pytest.mark.parametrize(
    "body",
    [
        {"name": "Upper"},
        {"name": "under_score"},
        {"name": "-lead"},
        {"name": "x" * 64},
        {"name": 5},
        {},
        {"name": "ok", "extra": True},
    ],
)
async def test_bad_project_bodies_are_400(api: Api, body: dict[str, object]) -> None:
    assert_error(await api.client.post("/v1/projects", json=body), 400, "invalid_input")


async def test_malformed_json_is_400(api: Api) -> None:
    response = await api.client.post(
        "/v1/projects", content=b"{nope", headers={"content-type": "application/json"}
    )
    assert_error(response, 400, "invalid_input")


async def test_unknown_routes_and_methods_use_the_error_shape(api: Api) -> None:
    assert_error(await api.client.get("/v1/nothing-here"), 404, "not_found")
    assert_error(await api.client.put("/v1/projects"), 405, "method_not_allowed")


async def test_a_405_lists_every_method_of_its_path(api: Api) -> None:
    # Each path below is served by several routes (each method its own)
    answer = await api.client.patch("/v1/projects")
    assert answer.headers["allow"] == "GET, POST"
    answer = await api.client.patch("/v1/projects/p/subscriptions/s")
    assert_error(answer, 405, "method_not_allowed")
    assert answer.headers["allow"] == "DELETE, GET, PUT"


async def test_topic_create_makes_ingest_and_main_topics(api: Api, project: str) -> None:
    body = {"name": "orders", "grouped": True, "partitions": 4, "retention_hours": 24}
    created = await api.client.post(f"/v1/projects/{project}/topics", json=body)
    assert created.status_code == 201, created.text
    view = created.json()
    assert {k: view[k] for k in body} == body
    rejects = ingest_rejects_topic(project, "orders")
    assert view["kafka"] == {
        "ingest_topic": ingest_topic(project, "orders"),
        "main_topic": main_topic(project, "orders"),
        "ingest_rejects_topic": rejects,
    }
    assert await partitions(api, ingest_topic(project, "orders")) == 4
    assert await partitions(api, main_topic(project, "orders")) == 4
    assert await partitions(api, rejects) == 4
    # Then it reads back, alone (with the records its ingest reject topic holds) or in the list
    one = (await api.client.get(f"/v1/projects/{project}/topics/orders")).json()
    assert one == {**view, "ingest_rejected": 0}
    assert (await api.client.get(f"/v1/projects/{project}/topics")).json() == {"topics": [view]}


async def test_topic_create_is_idempotent_and_conflicts_on_a_difference(
    api: Api, project: str
) -> None:
    url = f"/v1/projects/{project}/topics"
    assert (await api.client.post(url, json={"name": "t", "partitions": 2})).status_code == 201
    assert (await api.client.post(url, json={"name": "t", "partitions": 2})).status_code == 200
    assert_error(await api.client.post(url, json={"name": "t", "partitions": 3}), 409, "conflict")
    assert_error(
        await api.client.post(url, json={"name": "t", "partitions": 2, "grouped": True}),
        409,
        "conflict",
    )


async def test_a_topics_message_id_window_is_part_of_its_configuration(
    api: Api, project: str
) -> None:
    url = f"/v1/projects/{project}/topics"
    # A topic takes the 5 minute window unless its body says otherwise
    default = await api.client.post(url, json={"name": "a", "partitions": 1})
    assert default.json()["dedup_window_seconds"] == 300
    off = {"name": "b", "partitions": 1, "dedup_window_seconds": 0}
    created = await api.client.post(url, json=off)
    assert created.status_code == 201, created.text
    assert created.json()["dedup_window_seconds"] == 0
    # The same body again is the same topic; another window is a different one
    assert (await api.client.post(url, json=off)).status_code == 200
    changed = {**off, "dedup_window_seconds": 60}
    assert_error(await api.client.post(url, json=changed), 409, "conflict")
    assert (await api.client.get(f"{url}/b")).json()["dedup_window_seconds"] == 0


@pytest.mark.parametrize(
    "body",
    [
        {"name": "t", "dedup_window_seconds": -1},
        {"name": "t", "dedup_window_seconds": 86_401},
        {"name": "t", "dedup_window_seconds": "300"},
        {"name": "Bad"},
        {"name": "t", "partitions": 0},
        {"name": "t", "partitions": "6"},
        {"name": "t", "retention_hours": 0},
        {"name": "t", "grouped": 1},
    ],
)
async def test_bad_topic_bodies_are_400(api: Api, project: str, body: dict[str, object]) -> None:
    assert_error(
        await api.client.post(f"/v1/projects/{project}/topics", json=body), 400, "invalid_input"
    )


async def test_topics_of_an_unknown_project_are_404(api: Api) -> None:
    missing = unique()
    assert_error(
        await api.client.post(f"/v1/projects/{missing}/topics", json={"name": "t"}),
        404,
        "not_found",
    )
    assert_error(await api.client.get(f"/v1/projects/{missing}/topics"), 404, "not_found")
    assert_error(await api.client.get(f"/v1/projects/{missing}/topics/t"), 404, "not_found")


async def test_topic_delete_removes_its_kafka_topics_but_empties_and_keeps_its_ingest_log(
    api: Api, project: str
) -> None:
    # Given topic t with three messages in its ingest log
    topics = f"/v1/projects/{project}/topics"
    await api.client.post(topics, json={"name": "t", "partitions": 1})
    for n in range(3):
        sent = await api.client.post(
            f"{topics}/t/produce", content=b"x", headers={"X_MESSAGE_ID": f"m{n}"}
        )
        assert sent.status_code == 200
    ingest = ingest_topic(project, "t")
    # When it is deleted
    assert (await api.client.delete(f"{topics}/t")).status_code == 204
    # Then its main and reject topics are gone, and its ingest log is kept, empty, and
    # retired (the ingest job skips it), so that its offsets never go backwards
    assert await partitions(api, main_topic(project, "t")) is None
    assert await partitions(api, ingest_rejects_topic(project, "t")) is None
    assert await partitions(api, groups_topic(project, "t")) is None
    assert await asyncio.to_thread(watermarks, api.settings.kafka_bootstrap or "", ingest) == (3, 3)
    redis = aioredis.from_url(api.settings.redis_url or "")
    try:
        assert await redis.sismember(keys.retired_ingest_topics(), ingest)
        assert_error(await api.client.get(f"{topics}/t"), 404, "not_found")
        assert_error(await api.client.delete(f"{topics}/t"), 404, "not_found")
        # And the name can be used again at once with the same partitions (another count is
        # refused, saying which), continuing the ingest log's offsets
        refused = await api.client.post(topics, json={"name": "t", "partitions": 2})
        assert_error(refused, 409, "conflict")
        assert "1 partitions" in refused.json()["error"]["message"]
        again = await api.client.post(topics, json={"name": "t", "partitions": 1})
        assert again.status_code == 201
        assert not await redis.sismember(keys.retired_ingest_topics(), ingest)
    finally:
        await redis.aclose()
    sent = await api.client.post(f"{topics}/t/produce", content=b"x", headers={"X_MESSAGE_ID": "n"})
    assert sent.status_code == 200
    assert await asyncio.to_thread(watermarks, api.settings.kafka_bootstrap or "", ingest) == (3, 4)


def watermarks(bootstrap: str, kafka_topic: str) -> tuple[int, int]:
    """(low, high) of partition 0 of ``kafka_topic``."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("marks")})
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(kafka_topic, 0), timeout=10)
        return int(low), int(high)
    finally:
        consumer.close()


async def test_project_with_a_topic_and_topic_with_a_subscription_cannot_be_deleted(
    api: Api, project: str
) -> None:
    await api.client.post(f"/v1/projects/{project}/topics", json={"name": "t", "partitions": 1})
    assert_error(await api.client.delete(f"/v1/projects/{project}"), 409, "conflict")
    sub = {"name": "s", "topic": "t", "endpoint": {"url": "https://hooks.example.com/x"}}
    assert (
        await api.client.post(f"/v1/projects/{project}/subscriptions", json=sub)
    ).status_code == 201
    assert_error(await api.client.delete(f"/v1/projects/{project}/topics/t"), 409, "conflict")
    # Then the topic is still there, Kafka topics included
    assert (await api.client.get(f"/v1/projects/{project}/topics/t")).status_code == 200
    assert await partitions(api, main_topic(project, "t")) == 1


async def test_producer_mark_reads_the_ingest_jobs_redis_hash(
    api: Api, project: str, redis_url: str
) -> None:
    await api.client.post(f"/v1/projects/{project}/topics", json={"name": "t", "partitions": 1})
    url = f"/v1/projects/{project}/topics/t/producers/prod-1"
    assert (await api.client.get(url)).json() == {"producer_id": "prod-1", "last_sequence_id": -1}
    # Given the ingest job recorded sequence 41 for this producer
    redis = aioredis.Redis.from_url(redis_url)
    try:
        await redis.hset(keys.producer_marks(project, "t"), "prod-1", "41")
        assert (await api.client.get(url)).json() == {
            "producer_id": "prod-1",
            "last_sequence_id": 41,
        }
    finally:
        await redis.delete(keys.producer_marks(project, "t"))
        await redis.aclose()  # type: ignore[attr-defined]
    assert_error(
        await api.client.get(f"/v1/projects/{project}/topics/nope/producers/prod-1"),
        404,
        "not_found",
    )
    assert_error(
        await api.client.get(f"/v1/projects/{project}/topics/t/producers/{'x' * 101}"),
        400,
        "invalid_input",
    )


async def test_a_producer_mark_redis_may_have_forgotten_is_a_503_not_a_minus_one(
    api: Api, project: str, redis_url: str
) -> None:
    # Given a producer whose mark the ingest job published, then Redis forgot everything
    await api.client.post(f"/v1/projects/{project}/topics", json={"name": "t", "partitions": 1})
    url = f"/v1/projects/{project}/topics/t/producers/prod-1"
    redis = aioredis.Redis.from_url(redis_url)
    try:
        await redis.delete(keys.producer_marks_loaded())
        # When the producer asks where to resume
        answer = await api.client.get(url)
        # Then it is told to try again, not to start from 0 (its new messages would be
        # dropped as repeats of what the ingest job remembers)
        assert_error(answer, 503, "dependency_unavailable")
        assert "ingest job" in answer.json()["error"]["message"]
        # And once the ingest job published the marks again, it gets an answer
        await redis.set(keys.producer_marks_loaded(), "1")
        assert (await api.client.get(url)).json()["last_sequence_id"] == -1
    finally:
        await redis.set(keys.producer_marks_loaded(), "1")
        await redis.aclose()  # type: ignore[attr-defined]


async def test_a_nul_character_is_a_400_and_creates_nothing(api: Api) -> None:
    name = unique()
    refused = await api.client.post("/v1/projects", json={"name": name, "description": "a\x00"})
    assert_error(refused, 400, "invalid_input")
    assert_error(await api.client.get(f"/v1/projects/{name}"), 404, "not_found")
