"""Produce on a three-node Kafka cluster (docs/design.md §7): the API answers 200 only once two
replicas hold a message. With two nodes down it answers 503, never 200, and the producer's
retry of the same message succeeds once they are back."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli.kafka_cluster import LocalKafkaCluster
from setu.names import ingest_topic
from tests.integration.api.support import (
    assert_error,
    headers_of,
    read_records,
    running_api,
    unique,
)
from tests.kafka_cluster import partitions, three_nodes
from tests.waiting import wait_for_async

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

PARTITIONS = 3
# How long the API waits for Kafka's acknowledgement before it answers 503.
PRODUCE_TIMEOUT_MS = 8_000


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKafkaCluster]:
    with three_nodes(tmp_path_factory.mktemp("kafka")) as running:
        yield running


def message(n: int) -> dict[str, str]:
    return {
        "X_MESSAGE_ID": f"m-{n}",
        "X_GROUP_ID": "g",
        "X_PRODUCER_ID": "shop",
        "X_SEQUENCE_ID": str(n),
    }


async def test_a_message_two_replicas_did_not_take_is_answered_503_never_200(
    cluster: LocalKafkaCluster, redis_url: str, tmp_path: Path
) -> None:
    bootstrap = cluster.bootstrap
    async with running_api(
        tmp_path,
        kafka_bootstrap=bootstrap,
        redis_url=redis_url,
        kafka_replication_factor=3,
        produce_timeout_ms=PRODUCE_TIMEOUT_MS,
    ) as api:
        project = unique()
        assert (await api.client.post("/v1/projects", json={"name": project})).status_code == 201
        created = await api.client.post(
            f"/v1/projects/{project}/topics",
            json={"name": "t", "grouped": True, "partitions": PARTITIONS},
        )
        assert created.status_code == 201, created.text
        url = f"/v1/projects/{project}/topics/t/produce"
        topic = ingest_topic(project, "t")
        # Given a message accepted while all three nodes run
        first = await api.client.post(url, content=b"one", headers=message(1))
        assert first.status_code == 200, first.text
        # When two nodes stop, leaving one replica of each partition in sync
        cluster.stop_node(2)
        cluster.stop_node(3)

        async def alone_in_every_isr() -> bool:
            found = await asyncio.to_thread(partitions, bootstrap, topic)
            return all(isr == [1] for _, isr in found.values())

        await wait_for_async("node 1 alone in every ISR", alone_in_every_isr, 60)
        # Then the next message is refused with 503 (a retryable answer), never 200
        refused = await api.client.post(url, content=b"two", headers=message(2))
        assert_error(refused, 503, "dependency_unavailable")
        # And when the nodes are back, the producer's retry of it is accepted
        cluster.start_node(2)
        cluster.start_node(3)

        async def accepted() -> bool:
            retry = await api.client.post(url, content=b"two", headers=message(2))
            assert retry.status_code in (200, 503), retry.text
            return retry.status_code == 200

        await wait_for_async("the retry accepted", accepted, 180)
        # And the group's partition holds both, in order (a copy of the refused attempt
        # that reached the leader first, if any, is the ingest job's to drop: same sequence)
        records = await asyncio.to_thread(read_records, bootstrap, topic, 3, 30.0)
        ids = [headers_of(r)["setu-message-id"].decode() for r in records]
        assert ids[0] == "m-1" and set(ids[1:]) == {"m-2"}, ids
