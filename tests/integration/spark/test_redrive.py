"""``setu redrive``: set-aside ingest records back to the main log, on the real broker."""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from cli.main import main
from setu import names
from setu.envelope import H_INGEST_OFFSET, H_INGEST_PARTITION, H_REJECT_REASON, Envelope
from setu.model import Topic
from state.kafka_admin import KafkaTopics
from tests.kafka_topics import partitions_of

pytestmark = pytest.mark.integration


def read_all(bootstrap: str, topic: str) -> list[tuple[bytes | None, dict[str, bytes]]]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex})
    try:
        partitions = partitions_of(consumer, topic)
        out = []
        for p in partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            if high > low:
                consumer.assign([TopicPartition(topic, p, low)])
                while len([m for m in out if m[2] == p]) < high - low:
                    for msg in consumer.consume(100, 1.0):
                        if msg.error() is None:
                            out.append((msg.value(), dict(msg.headers() or []), p))
        return [(value, headers) for value, headers, _ in out]
    finally:
        consumer.close()


def test_redrive_copies_set_aside_records_once_without_their_ingest_position(
    kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given a topic whose ingest reject topic holds two records the ingest job set aside
    project = f"rd-{uuid.uuid4().hex[:8]}"
    topic = Topic(project, "t", grouped=True, partitions=2)
    admin = KafkaTopics(kafka_bootstrap)
    admin.ensure_topic(topic)
    rejects = names.ingest_rejects_topic(project, "t")
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "partitioner": "murmur2_random"})
    for n in range(2):
        env = Envelope(f"m{n}", f"body {n}".encode(), group_id="g", ingest_partition=1)
        headers = [
            *env.kafka_headers(),
            (H_INGEST_OFFSET, str(n).encode()),
            (H_REJECT_REASON, b"record of 9000 bytes is over the 4096 bytes ..."),
        ]
        producer.produce(rejects, env.body, env.key, headers=headers)
    assert producer.flush(10) == 0
    monkeypatch.setenv("SETU_KAFKA_BOOTSTRAP", kafka_bootstrap)
    try:
        # When an operator re-drives them, twice
        assert main(["redrive", project, "t"]) == 0
        assert main(["redrive", project, "t"]) == 0
        # Then the main log has each once, in order, without reason or ingest position
        copied = read_all(kafka_bootstrap, names.main_topic(project, "t"))
        assert [value for value, _ in copied] == [b"body 0", b"body 1"]
        for _, headers in copied:
            assert not {H_REJECT_REASON, H_INGEST_PARTITION, H_INGEST_OFFSET} & set(headers)
            assert headers["setu-group-id"] == b"g"
        said = capsys.readouterr().out
        assert f"copied 2 record(s) from {rejects}" in said
        assert f"copied 0 record(s) from {rejects}" in said
    finally:
        admin.delete_topic(topic)
