"""When Kafka or Redis does not answer: 503 with the error shape, never a false 2xx."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from setu.model import Project, Topic
from tests.integration.api.support import Api, assert_error, running_api

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

# Nothing listens on port 1.
NOWHERE = "127.0.0.1:1"
TIMEOUT_MS = 1_500


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def kafka_down(
    redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Api]:
    async with running_api(
        tmp_path_factory.mktemp("kafka-down"),
        kafka_bootstrap=NOWHERE,
        redis_url=redis_url,
        produce_timeout_ms=TIMEOUT_MS,
    ) as api:
        # Given a topic the store knows (creating it through the API needs Kafka)
        store = api.app.state.store
        store.create_project(Project("p"))
        store.create_topic(Topic("p", "t", grouped=False, partitions=1))
        yield api


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def redis_down(
    kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Api]:
    data: Path = tmp_path_factory.mktemp("redis-down")
    async with running_api(
        data, kafka_bootstrap=kafka_bootstrap, redis_url=f"redis://{NOWHERE}/0"
    ) as api:
        store = api.app.state.store
        store.create_project(Project("p"))
        store.create_topic(Topic("p", "t", grouped=False, partitions=1))
        yield api


async def test_produce_without_kafka_is_503_within_the_timeout(kafka_down: Api) -> None:
    started = time.monotonic()
    response = await kafka_down.client.post(
        "/v1/projects/p/topics/t/produce", content=b"x", headers={"X-Message-Id": "m"}
    )
    assert_error(response, 503, "dependency_unavailable")
    assert time.monotonic() - started < TIMEOUT_MS / 1000 + 3


async def test_batch_without_kafka_is_503_with_every_message_failed(kafka_down: Api) -> None:
    messages = [{"message_id": f"m{i}", "body": "x"} for i in range(3)]
    response = await kafka_down.client.post(
        "/v1/projects/p/topics/t/produce/batch", json={"messages": messages}
    )
    assert response.status_code == 503
    report = response.json()
    assert report["error"]["code"] == "dependency_unavailable"
    assert [r["status"] for r in report["results"]] == ["error"] * 3


async def test_topic_create_without_kafka_is_503_and_stores_nothing(kafka_down: Api) -> None:
    response = await kafka_down.client.post("/v1/projects/p/topics", json={"name": "new"})
    assert_error(response, 503, "dependency_unavailable")
    assert_error(await kafka_down.client.get("/v1/projects/p/topics/new"), 404, "not_found")


async def test_health_names_kafka_as_down(kafka_down: Api) -> None:
    response = await kafka_down.client.get("/v1/health")
    assert response.status_code == 503
    report = response.json()
    assert report["status"] == "degraded"
    assert report["components"]["kafka"]["ok"] is False
    assert report["components"]["redis"]["ok"] is True
    assert report["components"]["database"]["ok"] is True


async def test_failed_produce_is_counted(kafka_down: Api) -> None:
    text = (await kafka_down.client.get("/metrics")).text
    assert 'setu_api_produced_messages_total{outcome="failed",project="",topic=""}' in text


async def test_health_names_redis_as_down(redis_down: Api) -> None:
    response = await redis_down.client.get("/v1/health")
    assert response.status_code == 503
    components = response.json()["components"]
    assert components["redis"]["ok"] is False
    assert components["kafka"]["ok"] is True


async def test_producer_mark_without_redis_is_503(redis_down: Api) -> None:
    response = await redis_down.client.get("/v1/projects/p/topics/t/producers/x")
    assert_error(response, 503, "dependency_unavailable")
