"""Produce with ``SETU_INGEST_LOG=shared`` (decision 0010): every way of producing writes to the
shared ingest log, keyed as before, naming the topic's main log in ``setu-topic``; topics get no
ingest topic of their own, and the API says where their records wait."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from confluent_kafka.admin import AdminClient

from setu import names
from setu.client import AsyncStreamProducer
from setu.envelope import H_MESSAGE_ID, H_TOPIC
from setu.partitioner import partition_for
from tests.integration.api.streams import address
from tests.integration.api.support import (
    MAX_MESSAGE_BYTES,
    Api,
    drop_project,
    headers_of,
    read_records,
    running_api,
    unique,
)

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

LOG_PARTITIONS = 4


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def api(
    kafka_bootstrap: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Api]:
    async with running_api(
        tmp_path_factory.mktemp("api"),
        kafka_bootstrap=kafka_bootstrap,
        redis_url=redis_url,
        max_message_bytes=MAX_MESSAGE_BYTES,
        stream_port=0,
        ingest_log="shared",
        ingest_log_topic=f"{names.SHARED_INGEST_LOG}-{unique()}",
        ingest_log_partitions=LOG_PARTITIONS,
    ) as running:
        yield running


@pytest_asyncio.fixture(loop_scope="module")
async def project(api: Api) -> AsyncIterator[str]:
    name = unique()
    assert (await api.client.post("/v1/projects", json={"name": name})).status_code == 201
    yield name
    await drop_project(api.client, name)


def kafka_topics(api: Api) -> set[str]:
    admin = AdminClient({"bootstrap.servers": api.settings.kafka_bootstrap or ""})
    return set(admin.list_topics(timeout=10).topics)


async def test_every_way_of_producing_writes_to_the_shared_log_naming_the_topic(
    api: Api, project: str
) -> None:
    # Given topic t of 6 partitions, with the shared log of 4
    created = await api.client.post(
        f"/v1/projects/{project}/topics", json={"name": "t", "grouped": True, "partitions": 6}
    )
    assert created.status_code == 201, created.text
    shared = api.settings.ingest_log_topic
    # Then it has a main log and a reject topic but no ingest topic of its own, and says so
    topics = await asyncio.to_thread(kafka_topics, api)
    assert shared in topics
    assert names.main_topic(project, "t") in topics
    assert names.ingest_topic(project, "t") not in topics
    assert created.json()["kafka"]["ingest_topic"] == shared

    # When one message is produced, then a batch of two, then one streamed
    url = f"/v1/projects/{project}/topics/t/produce"
    one = await api.client.post(
        url, content=b"a", headers={"X_MESSAGE_ID": "one", "X_GROUP_ID": "g1"}
    )
    assert one.status_code == 200, one.text
    batch = await api.client.post(
        f"{url}/batch",
        json={
            "messages": [
                {"message_id": "two", "group_id": "g1", "body": "b"},
                {"message_id": "three", "group_id": "g2", "body": "c"},
            ]
        },
    )
    assert batch.status_code == 200, batch.text
    key = await api.client.post(
        f"/v1/projects/{project}/keys", json={"name": unique("k"), "role": "producer"}
    )
    producer = AsyncStreamProducer(address(api), key.json()["key"], project, "t", "streamer")
    assert await producer.start() == 0
    await producer.send(b"d", group_id="g2")
    await producer.close()

    # Then all four are in the shared log, on their group's partition of it, naming t's main log
    found = await asyncio.to_thread(read_records, api.settings.kafka_bootstrap or "", shared, 4)
    by_id = {headers_of(r)[H_MESSAGE_ID].decode(): r for r in found}
    assert set(by_id) == {"one", "two", "three", "streamer:0"}
    for record in found:
        assert headers_of(record)[H_TOPIC] == names.main_topic(project, "t").encode()
        assert record.partition() == partition_for(record.key(), LOG_PARTITIONS)
    assert by_id["one"].partition() == by_id["two"].partition()
