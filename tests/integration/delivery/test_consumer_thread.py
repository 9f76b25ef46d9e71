"""The consumer thread when a takeover fails (Redis away in the middle of it, say): it ends
with that error, leaving its group at once, instead of closing on a half-made assignment
(which makes librdkafka abort the whole process)."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from delivery.kafka_io import Assignment, ConsumerThread, consumer_config
from setu.limits import DEFAULT_MAX_MESSAGE_BYTES, MessageLimits

pytestmark = pytest.mark.integration


class Listener:
    """Fails its takeovers (``fail``), or records what it was given."""

    def __init__(self, fail: bool) -> None:
        self.fail = fail
        self.assigned_partitions: list[int] = []

    def on_batch(self, messages: list[object]) -> None:
        pass

    async def assigned(self, committed: list[TopicPartition]) -> Assignment:
        if self.fail:
            raise RuntimeError("Redis went away during the takeover")
        self.assigned_partitions = sorted(tp.partition for tp in committed)
        return Assignment([TopicPartition(tp.topic, tp.partition, -1001) for tp in committed], [])

    async def revoked(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        return []

    def committed(self, offsets: list[TopicPartition]) -> None:
        pass

    def lost(self, partitions: list[TopicPartition]) -> None:
        pass


async def test_a_failed_takeover_ends_the_consumer_which_leaves_its_partitions(
    kafka_bootstrap: str,
) -> None:
    topic = f"ct-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(30)
    group = f"g-{uuid.uuid4().hex[:8]}"
    limits = MessageLimits(DEFAULT_MAX_MESSAGE_BYTES)
    loop = asyncio.get_running_loop()
    # Given a consumer whose takeover fails
    first = ConsumerThread(
        consumer_config(kafka_bootstrap, group, "a", limits), loop, Listener(True)
    )
    first.start([topic])
    # Then it ends with that error
    with pytest.raises(RuntimeError, match="takeover"):
        await asyncio.wait_for(asyncio.shield(first.done), 60)
    await first.close()
    # And another member of the group gets every partition without waiting out a session
    listener = Listener(False)
    second = ConsumerThread(consumer_config(kafka_bootstrap, group, "b", limits), loop, listener)
    second.start([topic])
    try:
        for _ in range(150):
            if listener.assigned_partitions == [0, 1]:
                break
            await asyncio.sleep(0.1)
        assert listener.assigned_partitions == [0, 1]
    finally:
        await second.close()
        admin.delete_topics([topic])
