from __future__ import annotations

from setu.envelope import Envelope


def test_envelope_survives_a_round_trip_through_kafka_headers() -> None:
    # Given a message with every field set
    original = Envelope(
        message_id="m1",
        body=b"\x00payload\xff",
        group_id="g1",
        producer_id="p1",
        sequence_id=7,
        headers=(("x-trace-id", "t"), ("X_TENANT", "acme")),
        produced_at_ms=1_700_000_000_000,
        ingest_partition=3,
        ingest_offset=99,
        ingest_log="setu.ingest",
        main_offset=12,
        attempt=2,
        failure_reason="status 503",
        last_status=503,
        failed_at_ms=1_700_000_000_500,
    )
    # When it is written as a Kafka record and read back
    again = Envelope.from_kafka(original.kafka_headers(), original.body)
    # Then nothing is lost or changed
    assert again == original


def test_the_key_is_the_group_else_the_message_id() -> None:
    assert Envelope("m1", b"", group_id="g1").key == b"g1"
    assert Envelope("m1", b"").key == b"m1"


def test_producer_headers_come_first_and_keep_their_names() -> None:
    headers = Envelope("m1", b"", headers=(("x-a", "1"),)).kafka_headers()
    assert headers[0] == ("x-a", b"1")
    assert ("setu-message-id", b"m1") in headers


def test_a_record_without_a_message_id_is_refused() -> None:
    import pytest

    with pytest.raises(ValueError, match="no setu-message-id"):
        Envelope.from_kafka([("x-a", b"1")], b"body")
