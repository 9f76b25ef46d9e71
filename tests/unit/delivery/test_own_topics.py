"""A subscription's retry tiers and DLQ made at its first copy there (delivery/own_topics.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from delivery import own_topics
from delivery.own_topics import MadeAtFirstCopy, OwnTopics
from setu.envelope import KafkaHeaders
from setu.errors import DependencyUnavailable

Records = Sequence[tuple[bytes, bytes | None, KafkaHeaders]]


class Kafka:
    """Which topics exist; making them takes a moment; writes are recorded."""

    def __init__(self, own: set[str]) -> None:
        self.own = own
        self.existing: set[str] = set()
        self.makes = 0
        self.writes: list[tuple[str, bool]] = []  # (topic, existed when written)
        self.answers: list[set[str]] | None = None  # what describe answers, in turn

    async def look(self) -> set[str]:
        if self.answers:
            return self.answers.pop(0)
        return self.own - self.existing

    async def make(self) -> None:
        self.makes += 1
        await asyncio.sleep(0.01)
        self.existing |= self.own

    async def send(self, topic: str, partition: int, records: Records) -> list[int]:
        self.writes.append((topic, topic in self.existing))
        return [0]


async def test_copies_at_once_to_missing_tiers_make_them_once_and_write_after() -> None:
    kafka = Kafka({"rq.1", "rq.2", "dlq"})
    own = OwnTopics(kafka.look, kafka.make)
    await own.look()
    copies = MadeAtFirstCopy(kafka, own)
    # When three partitions copy to rq.1 at once, then one to the DLQ
    await asyncio.gather(*(copies.send("rq.1", p, []) for p in range(3)))
    await copies.send("dlq", 0, [])
    # Then the topics were made once, before any write
    assert kafka.makes == 1
    assert kafka.writes == [("rq.1", True)] * 3 + [("dlq", True)]
    assert own.missing == set()


async def test_a_topic_seen_once_is_never_taken_for_missing_again() -> None:
    kafka = Kafka({"rq.1", "dlq"})
    own = OwnTopics(kafka.look, kafka.make)
    # Given a first look that saw rq.1 (another worker made it) but not the DLQ
    kafka.answers = [{"dlq"}, {"rq.1", "dlq"}]
    await own.look()
    assert own.missing == {"dlq"}
    # When a broker whose metadata lags says rq.1 is missing at the next look
    await own.look()
    # Then rq.1 still counts as existing: a tier holding messages is never read as empty
    assert own.present("rq.1")
    assert not own.present("dlq")


async def test_kafka_too_slow_to_make_them_is_asked_again_and_the_copy_waits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(own_topics, "MAKE_RETRY_S", 0.01)
    kafka = Kafka({"rq.1", "dlq"})
    slow = [DependencyUnavailable("Kafka topics did not appear in time")] * 2

    async def make() -> None:
        if slow:
            raise slow.pop()
        await kafka.make()

    own = OwnTopics(kafka.look, make)
    await own.look()
    # When the first copy's topics take Kafka three tries to make
    await MadeAtFirstCopy(kafka, own).send("rq.1", 0, [])
    # Then the copy was written once they existed, and nothing failed
    assert kafka.writes == [("rq.1", True)]
