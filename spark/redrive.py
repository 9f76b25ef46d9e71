"""``setu redrive PROJECT TOPIC``: copies the records the ingest job set aside for a topic
(:mod:`spark.rejects`) to its main log, once the cause is fixed.

A copy loses the reject reason and its ingest position (``setu-ingest-partition`` and
``-offset``): delivery skips a main-log record whose ingest position is not above one it
already read (a replayed ingest batch, ``delivery.replays``), and a re-driven record always
is. Progress is committed in the consumer group ``setu.redrive.{project}.{topic}`` after the
copies are acknowledged, so running it again copies only what was set aside since; a crash in
between copies a record twice (at-least-once, with the same message id).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    Message,
    Producer,
    TopicPartition,
)

from setu.envelope import H_INGEST_OFFSET, H_INGEST_PARTITION, H_REJECT_REASON
from setu.names import ingest_rejects_topic, main_topic
from setu.producer_settings import durable_producer

DROPPED_HEADERS = frozenset({H_INGEST_OFFSET, H_INGEST_PARTITION, H_REJECT_REASON})


class RedriveFailed(RuntimeError):
    """Raised when copies were not acknowledged (nothing is committed then)."""


@dataclass(frozen=True, slots=True)
class Redriven:
    copied: int
    source: str
    target: str


Headers = list[tuple[str, str | bytes | None]]


def redriven_headers(headers: Iterable[tuple[str, str | bytes | None]]) -> Headers:
    """A set-aside record's headers as its main-log copy carries them."""
    return [(name, value) for name, value in headers if name not in DROPPED_HEADERS]


def redrive(
    bootstrap: str,
    project: str,
    topic: str,
    timeout_s: float = 60.0,
    client_config: Mapping[str, str] | None = None,
) -> Redriven:
    """Copies every record set aside for ``project``/``topic`` and not copied before;
    ``client_config`` says how to reach the broker (docs/security.md §8)."""
    source, target = ingest_rejects_topic(project, topic), main_topic(project, topic)
    group = f"setu.redrive.{project}.{topic}"
    connection = {"bootstrap.servers": bootstrap, **(client_config or {})}
    consumer = Consumer({**connection, "group.id": group, "enable.auto.commit": False})
    producer = Producer(durable_producer(bootstrap, client_config))
    try:
        metadata = consumer.list_topics(source, timeout=10).topics[source]
        if metadata.error is not None:
            raise RedriveFailed(f"{source}: {metadata.error}")
        partitions = [TopicPartition(source, p) for p in metadata.partitions]
        ends = {
            tp.partition: consumer.get_watermark_offsets(tp, timeout=10)[1] for tp in partitions
        }
        starts = consumer.committed(partitions, timeout=10)
        todo = [
            TopicPartition(source, tp.partition, tp.offset if tp.offset >= 0 else OFFSET_BEGINNING)
            for tp in starts
        ]
        messages = _read(consumer, todo, ends, timeout_s)
        errors: list[str] = []

        def acked(err: KafkaError | None, msg: Message) -> None:
            if err is not None:
                errors.append(err.str())

        for msg in messages:
            raw = msg.headers() or []
            headers = redriven_headers(raw.items() if isinstance(raw, dict) else raw)
            producer.produce(target, msg.value(), msg.key(), headers=headers, on_delivery=acked)
            producer.poll(0)
        left = producer.flush(timeout_s)
        if errors or left:
            raise RedriveFailed(f"{len(errors)} copies failed ({errors[:3]}), {left} unanswered")
        done = [TopicPartition(source, p, end) for p, end in ends.items()]
        consumer.commit(offsets=done, asynchronous=False)
        return Redriven(len(messages), source, target)
    finally:
        consumer.close()


def _read(
    consumer: Consumer, todo: list[TopicPartition], ends: dict[int, int], timeout_s: float
) -> list[Message]:
    """Every record of ``todo`` up to ``ends``, in each partition's order."""
    waiting = set()
    for tp in todo:
        low = consumer.get_watermark_offsets(tp, timeout=10)[0]
        if ends[tp.partition] > max(low, tp.offset):
            waiting.add(tp.partition)
    consumer.assign(todo)
    out: list[Message] = []
    deadline = time.monotonic() + timeout_s
    while waiting:
        if time.monotonic() > deadline:
            raise RedriveFailed(f"reading {sorted(waiting)} took longer than {timeout_s} s")
        for msg in consumer.consume(500, 0.5):
            partition, offset = msg.partition(), msg.offset()
            if msg.error() or partition is None or offset is None or offset >= ends[partition]:
                continue
            out.append(msg)
            if offset >= ends[partition] - 1:
                waiting.discard(partition)
    return out
