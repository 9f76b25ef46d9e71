"""The retired-topics list and the ingest job's report: the same contract on Redis and on
the stub (state.retired_topics, state.ingest_status)."""

from __future__ import annotations

import uuid

import pytest
import redis
from redis.asyncio import Redis

from state import keys
from state.ingest_status import (
    IngestStatus,
    RedisIngestStatus,
    StubIngestStatus,
    read_status_async,
)
from state.retired_topics import RedisRetiredList, RetiredList, RetiredTopics, StubRetiredList
from tests.integration.contracts import Backing, contract

pytestmark = pytest.mark.integration


retired = contract(
    {
        "stub": lambda backing: StubRetiredList(),
        "redis": lambda backing: RedisRetiredList(backing.async_client()),
    }
)


async def test_a_retired_topic_is_listed_until_it_is_reopened(retired: RetiredList) -> None:
    topic, other = f"setu.i.{uuid.uuid4().hex[:8]}", f"setu.i.{uuid.uuid4().hex[:8]}"
    assert not await retired.is_retired(topic)
    await retired.retire(topic)
    await retired.retire(topic)
    assert await retired.is_retired(topic)
    assert not await retired.is_retired(other)
    await retired.reopen(topic)
    assert not await retired.is_retired(topic)
    await retired.reopen(topic)  # reopening twice is the same as once
    assert not await retired.is_retired(topic)


async def test_the_ingest_job_reads_what_the_api_retired(redis_url: str) -> None:
    topic = f"setu.i.{uuid.uuid4().hex[:8]}"
    client: Redis[bytes] = Redis.from_url(redis_url)
    sync_client = redis.Redis.from_url(redis_url)
    try:
        await RedisRetiredList(client).retire(topic)
        assert topic in RetiredTopics(sync_client)()
        await RedisRetiredList(client).reopen(topic)
        assert topic not in RetiredTopics(sync_client)()
    finally:
        await client.aclose()  # type: ignore[attr-defined]
        sync_client.close()


def redis_status(backing: Backing) -> IngestStatus:
    backing.forget(keys.ingest_status())
    return RedisIngestStatus(backing.client())


status = contract({"stub": lambda backing: StubIngestStatus(), "redis": redis_status})


def test_the_report_merges_fields_and_an_empty_error_clears_the_last_failure(
    status: IngestStatus,
) -> None:
    assert status.read() == {}
    status.write({"state": "failed", "at": 5, "error": "broker away"})
    status.write({"state": "running", "at": 7})
    assert status.read() == {"state": "running", "at": "7", "error": "broker away"}
    status.write({"at": 9, "error": ""})
    assert status.read() == {"state": "running", "at": "9"}


async def test_the_api_reads_the_report_the_job_wrote(redis_url: str) -> None:
    sync_client = redis.Redis.from_url(redis_url)
    client: Redis[bytes] = Redis.from_url(redis_url)
    try:
        sync_client.delete(keys.ingest_status())
        RedisIngestStatus(sync_client).write({"state": "running", "behind": 3})
        assert await read_status_async(client) == {"state": "running", "behind": "3"}
    finally:
        sync_client.delete(keys.ingest_status())
        sync_client.close()
        await client.aclose()  # type: ignore[attr-defined]
