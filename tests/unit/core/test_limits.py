"""Every size limit along a message's path follows from SETU_MAX_MESSAGE_BYTES (setu.limits)."""

from __future__ import annotations

import pytest

from api.producer import api_producer_config
from delivery.kafka_io import consumer_config, copy_producer_config
from setu.envelope import Envelope
from setu.limits import (
    MAX_BATCH_BYTES,
    MAX_FAILURE_REASON_CHARS,
    MAX_FORWARDED_HEADER_BYTES,
    MessageLimits,
)
from setu.settings import Settings
from spark.job import sink_options
from state.kafka_admin import topic_config

BODIES = [1, 64 * 1024, 1024 * 1024, 8 * 1024 * 1024]


def largest_record(body_bytes: int) -> int:
    """The bytes of the largest record the API can accept for ``body_bytes``: the body, the
    ids at their longest, X_* headers up to their limit, and Setu's own headers as a DLQ copy
    carries them (Kafka's framing comes on top: a few dozen bytes a record)."""
    env = Envelope(
        "m" * 100,
        b"x" * body_bytes,
        group_id="g" * 100,
        producer_id="p" * 100,
        sequence_id=2**63 - 1,
        headers=(("X_PAD", "v" * (MAX_FORWARDED_HEADER_BYTES - 5)),),
        produced_at_ms=2**62,
        ingest_partition=2**31,
        ingest_offset=2**62,
        main_offset=2**62,
        attempt=99,
        failure_reason="e" * MAX_FAILURE_REASON_CHARS,
        last_status=599,
        failed_at_ms=2**62,
    )
    headers = sum(len(k) + len(v or b"") for k, v in env.kafka_headers())
    return len(env.body) + len(env.key) + headers + 200  # origin, kind, epoch, due


@pytest.mark.parametrize("body_bytes", BODIES)
def test_every_stage_carries_the_largest_record_the_api_accepts(body_bytes: int) -> None:
    # Given the largest body the API accepts, with every header at its longest
    limits = MessageLimits(body_bytes)
    record = largest_record(body_bytes)
    settings = Settings(max_message_bytes=body_bytes, kafka_bootstrap="k:9092")
    # Then every topic, producer and consumer of its path takes it
    assert record <= limits.record_bytes <= limits.topic_bytes
    assert int(topic_config(1, 1, body_bytes)["max.message.bytes"]) == limits.topic_bytes
    api = api_producer_config("k:9092", ack_timeout_ms=1, max_message_bytes=body_bytes)
    assert api["message.max.bytes"] > limits.topic_bytes
    assert int(sink_options(settings)["kafka.max.request.size"]) > limits.topic_bytes
    assert copy_producer_config("k:9092", "c", limits)["message.max.bytes"] > limits.topic_bytes
    consumer = consumer_config("k:9092", "g", "c", limits)
    assert consumer["max.partition.fetch.bytes"] >= limits.topic_bytes


@pytest.mark.parametrize("body_bytes", BODIES)
def test_a_topic_takes_a_full_batch_of_small_records(body_bytes: int) -> None:
    assert MessageLimits(body_bytes).topic_bytes >= MAX_BATCH_BYTES


def test_the_default_limit_carries_a_body_of_exactly_one_mib_through_the_spark_sink() -> None:
    # The case that stopped ingest: 1,048,576 bytes of body, 1,048,787 serialized
    options = sink_options(Settings(kafka_bootstrap="k:9092"))
    assert int(options["kafka.max.request.size"]) > 1_048_787


def test_a_limit_below_one_byte_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1 byte"):
        MessageLimits(0)
