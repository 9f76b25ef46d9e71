"""The group-state changelog of one subscription on Kafka, as a delivery worker uses it
(:mod:`state.changelog`): written with the worker's producer, read with its reader. The
runner makes the topic before its first use when it is missing (a subscription created by an
older version, or one whose topics the API has not made yet: ``prepare`` in
delivery/worker.py)."""

from __future__ import annotations

from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from delivery.kafka_io import AsyncProducer
from setu import names
from setu.model import Subscription
from state.changelog import Entry, KafkaChangelog, entry_of
from state.kafka_reader import KafkaReader


def subscription_changelog(
    sub: Subscription, producer: AsyncProducer, reader: KafkaReader
) -> KafkaChangelog:
    async def read(topic: str, partition: int, start: int) -> tuple[list[Entry], int]:
        begin = TopicPartition(topic, partition, start if start > 0 else OFFSET_BEGINNING)
        tails = await reader.tails_together([begin])
        entries = []
        for msg in tails.get((topic, partition), []):
            offset = msg.offset()
            headers = msg.headers() or []
            pairs = headers.items() if isinstance(headers, dict) else headers
            entry = entry_of(msg.key(), msg.value(), pairs, offset or 0)
            if entry is not None:
                entries.append(entry)
        return entries, tails.ends[(topic, partition)]

    return KafkaChangelog(names.state_topic(sub.project, sub.name), producer.send, read)
