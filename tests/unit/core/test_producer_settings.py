"""Every producer of Setu's records is built on the one durable rule (setu/producer_settings.py)."""

from __future__ import annotations

from api.producer import api_producer_config
from delivery.kafka_io import copy_producer_config
from setu.limits import MessageLimits
from setu.producer_settings import durable_producer


def test_the_api_and_delivery_producers_write_durably_with_the_java_partitioner() -> None:
    rule = durable_producer("k:9092")
    assert rule["acks"] == "all" and rule["enable.idempotence"] is True
    assert rule["partitioner"] == "murmur2_random"
    built = [
        api_producer_config("k:9092", ack_timeout_ms=1, max_message_bytes=1024),
        # a client setting cannot loosen the rule
        copy_producer_config("k:9092", "c", MessageLimits(1024), {"acks": "1"}),
    ]
    for config in built:
        assert {k: config[k] for k in rule} == rule
