"""Whether a subscription's consumer group has members (a worker of the earlier layout still
serving it), asked for many groups at once on a real broker (state/group_offsets.py)."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from state.group_offsets import GroupNotEmpty, GroupOffsets
from tests.waiting import wait_for

pytestmark = pytest.mark.integration


def test_only_a_group_a_consumer_serves_has_members_asked_together(kafka_bootstrap: str) -> None:
    name = f"members-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    admin.create_topics([NewTopic(name, 2, 1)])[name].result(30)
    served, kept, unknown = (f"{name}.{kind}" for kind in ("served", "kept", "unknown"))
    # Given a group a consumer has joined (a worker of the earlier layout) ...
    consumer = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": served})
    consumer.subscribe([name])
    try:
        wait_for(
            "the consumer's assignment",
            lambda: bool(consumer.poll(0.2) or consumer.assignment()),
            60,
        )

        async def scenario() -> None:
            offsets = GroupOffsets(kafka_bootstrap)
            # ... and a group that only holds offsets, as every subscription's group of this
            # layout, and one that does not exist
            await offsets.commit(kept, [TopicPartition(name, 0, 3)])
            # When a takeover of each asks at once
            answers = await asyncio.gather(
                *(offsets.has_members(g) for g in (served, kept, unknown))
            )
            # Then only the served one has members, and a commit to it is refused
            assert answers == [True, False, False]
            with pytest.raises(GroupNotEmpty):
                await offsets.commit(served, [TopicPartition(name, 0, 3)])

        asyncio.run(scenario())
    finally:
        consumer.close()
        admin.delete_topics([name])
