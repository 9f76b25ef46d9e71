"""A record Kafka acknowledged without writing it is reported as failed
(delivery/kafka_io.py, ``AckOrder``): a copy counted in a group's state but missing from its
tier leaves the group waiting for ever."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, cast

import pytest
from confluent_kafka import Message

from delivery.kafka_io import AckOrder, AsyncProducer, DroppedWrite


@dataclass
class Report:
    """A delivery report's message, as librdkafka hands it over."""

    topic_name: str
    partition_index: int
    at: int

    def topic(self) -> str:
        return self.topic_name

    def partition(self) -> int:
        return self.partition_index

    def offset(self) -> int:
        return self.at


def test_offsets_rise_per_partition_and_one_that_does_not_is_refused_once() -> None:
    acks = AckOrder()
    assert acks.acknowledged("rq.1", 0, 0)
    assert acks.acknowledged("rq.1", 1, 0)  # another partition counts on its own
    assert acks.acknowledged("rq.1", 0, 1)
    # A second record acknowledged at an offset already acknowledged was not written
    assert not acks.acknowledged("rq.1", 0, 1)
    # After that the partition is watched afresh (a topic made again starts at 0)
    assert acks.acknowledged("rq.1", 0, 0)
    assert acks.acknowledged("rq.1", 0, 5)


async def test_a_copy_acknowledged_at_another_copys_offset_fails_its_send() -> None:
    # Given a producer (never connected) that saw one copy acknowledged at offset 0
    producer = AsyncProducer({"bootstrap.servers": "127.0.0.1:1"}, asyncio.get_running_loop())
    try:
        loop = asyncio.get_running_loop()
        first: asyncio.Future[int] = loop.create_future()
        second: asyncio.Future[int] = loop.create_future()
        producer._settle(first, None, cast(Message, cast(Any, Report("rq.1", 0, 0))))
        # When another copy to the same partition is acknowledged at the same offset (the
        # broker took it for a duplicate of the first)
        producer._settle(second, None, cast(Message, cast(Any, Report("rq.1", 0, 0))))
        # Then the first is written at 0 and the second's send fails, so its runner never
        # counts a copy that is not there
        assert await first == 0
        with pytest.raises(DroppedWrite):
            await second
    finally:
        await producer.close(0.1)
