"""Reading a subscription's DLQ at the end of a crash run, for the checker's retry-budget check."""

from __future__ import annotations

from collections.abc import Sequence

from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from bench.crash.checker import DeadLetter
from setu.model import RetryPolicy
from setu.ordering.groups import Kind
from setu.ordering.tiers import DLQ
from state.kafka_reader import KafkaReader, record_of

# Copies written because the message itself failed; parks and forwards only follow their group.
FAILED_KINDS = (Kind.HEAD, Kind.SKIP, Kind.DEAD)


def read_dead_letters(
    bootstrap: str, topics: Sequence[str], partitions: int, policy: RetryPolicy
) -> dict[str, list[DeadLetter]]:
    """Every failed message's record in each DLQ of ``topics`` (one read for all of them), in
    partition and offset order, by topic. A DLQ that does not exist holds none: it is made at
    its subscription's first copy there (docs/decisions/0014-no-topics-until-a-failure.md)."""
    reader = KafkaReader(bootstrap)
    found = reader.existing(topics)
    starts = [TopicPartition(t, p, OFFSET_BEGINNING) for t in found for p in range(partitions)]
    tails = reader.tails(starts)
    out: dict[str, list[DeadLetter]] = {topic: [] for topic in topics}
    for topic in topics:
        for partition in range(partitions):
            for msg in tails.records.get((topic, partition), []):
                try:
                    rec = record_of(DLQ, msg)
                except ValueError:
                    continue
                if rec.kind not in FAILED_KINDS:
                    continue
                status = rec.envelope.last_status
                out[topic].append(
                    DeadLetter(
                        rec.message_id,
                        rec.group or "",
                        rec.envelope.attempt,
                        status,
                        retryable=status is None or policy.is_retryable(status),
                    )
                )
    return out
