"""One app per test module (its lifespan opens real Kafka, Redis and SQLite connections) and
one fresh project per test, deleted afterwards with its Kafka topics."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
import redis

from state import keys
from tests.integration.api.support import (
    MAX_MESSAGE_BYTES,
    Api,
    drop_project,
    running_api,
    unique,
)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def api(
    kafka_bootstrap: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Api]:
    async with running_api(
        tmp_path_factory.mktemp("api"),
        kafka_bootstrap=kafka_bootstrap,
        redis_url=redis_url,
        max_message_bytes=MAX_MESSAGE_BYTES,
        max_batch_messages=50,
        max_batch_bytes=512 * 1024,
    ) as running:
        yield running


@pytest_asyncio.fixture(loop_scope="module")
async def project(api: Api) -> AsyncIterator[str]:
    name = unique()
    created = await api.client.post("/v1/projects", json={"name": name})
    assert created.status_code == 201
    yield name
    await drop_project(api.client, name)


@pytest.fixture(autouse=True)
def producer_marks_loaded(redis_url: str) -> None:
    """What the ingest job keeps true while it runs (spark/marks.py): Redis holds every
    producer mark. These tests run the API without the ingest job."""
    client = redis.Redis.from_url(redis_url)
    try:
        client.set(keys.producer_marks_loaded(), "1")
    finally:
        client.close()
