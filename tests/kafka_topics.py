"""Kafka topic metadata for tests, once the broker has it all.

Right after ``CreateTopics`` returns, a broker can still answer a metadata request for the
new topic with an error and no partitions: its cache follows the controller's log a little
behind (6 of 150 fresh topics here on an idle machine, more under load). A reader assigned
the partitions listed then reads nothing, ever: tests waited for messages that were there.
"""

from __future__ import annotations

from typing import Protocol

from confluent_kafka.admin import ClusterMetadata

from tests.waiting import wait_for


class Lists(Protocol):
    def list_topics(self, topic: str | None = ..., timeout: float = ...) -> ClusterMetadata: ...


def partitions_of(client: Lists, topic: str, timeout_s: float = 30.0) -> list[int]:
    """``topic``'s partition ids, once the broker lists the topic without an error."""
    found: list[int] = []

    def listed() -> bool:
        described = client.list_topics(topic, timeout=10).topics.get(topic)
        if described is None or described.error is not None or not described.partitions:
            return False
        found[:] = sorted(described.partitions)
        return True

    wait_for(f"the broker to list {topic}", listed, timeout_s, every_s=0.1)
    return found
