"""A subscription created through the API, as a platform team creates hundreds: its first
takeover starts at its topic's first message without asking Kafka for its group's offsets (it
has none: docs/delivery.md, "Many subscriptions at once"), and a worker that takes it over
after another asks them and delivers nothing twice."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest
from confluent_kafka import TopicPartition

from state.group_offsets import GroupOffsets
from tests.integration.delivery.support import (
    Receiver,
    ThreadWorker,
    World,
    serving_api,
    wait_for,
)

pytestmark = pytest.mark.integration


def test_a_new_subscription_starts_at_its_first_message_and_its_next_owner_repeats_nothing(
    world: World,
    receiver: Receiver,
    start_worker: Callable[..., ThreadWorker],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Every read of a group's committed offsets is counted (and made, as always)
    reads: list[str] = []
    committed = GroupOffsets.committed

    async def counted(
        self: GroupOffsets,
        group: str,
        partitions: Sequence[TopicPartition],
        timeout_s: float = 30.0,
    ) -> list[TopicPartition]:
        reads.append(group)
        return await committed(self, group, partitions, timeout_s)

    monkeypatch.setattr(GroupOffsets, "committed", counted)
    # Given messages on a topic before any subscription of it exists
    world.topic("t")
    first = world.publish("t", "g", 3)
    # When a subscription is created through the API, and a worker runs it
    with serving_api(world) as api:
        made = api.post(
            f"/v1/projects/{world.project}/subscriptions",
            json={
                "name": "s",
                "topic": "t",
                "endpoint": {"url": receiver.url},
                "retry": {"delays_ms": [200, 400]},
            },
        )
        assert made.status_code == 201, made.text
    worker = start_worker()
    # Then it delivers from the topic's first message, in order, and asked Kafka for no
    # offsets of its group
    wait_for("the first messages", lambda: receiver.delivered("g") == first, 60)
    assert reads == []
    # When that worker stops (committing where it got to) and another takes the subscription
    # over, with more messages published meanwhile
    worker.stop()
    later = world.publish("t", "g", 2)
    start_worker()
    # Then the next owner asks the group's offsets and goes on from them: the later messages
    # arrive right after the first ones, none of which comes again before them
    wait_for("the later messages", lambda: receiver.delivered("g") == first + later, 60)
    assert reads == [f"setu.sub.{world.project}.s"]
