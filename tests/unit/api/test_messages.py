"""Produce requests to envelopes: header scan, single produce, batch documents."""

from __future__ import annotations

import base64
from dataclasses import replace
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from api.messages import (
    MAX_FORWARDED_HEADER_BYTES,
    IngestRecord,
    batch_results,
    batch_status,
    decode_header_value,
    dedup_window_for,
    incarnation_for,
    ingest_headers,
    parse_batch,
    scan_headers,
    schedule_limit_ms,
    single_envelope,
    streamed_headers,
    trace_headers,
)
from setu.envelope import H_DEDUP_WINDOW, H_TOPIC_INCARNATION, Envelope
from setu.errors import InvalidInput, PayloadTooLarge
from setu.model import Topic


def test_scan_keeps_x_headers_in_order_and_reads_content_length() -> None:
    raw = [
        (b"host", b"api"),
        (b"content-length", b"5"),
        (b"x_message_id", b"m1"),
        (b"x-group-id", b"g1"),
        (b"content-type", b"text/plain"),
        (b"x-trace", b"t"),
        (b"traceparent", b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
    ]
    length, found, content_type, traceparent, tracestate = scan_headers(raw)
    assert traceparent == "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    assert tracestate is None
    assert length == 5
    assert found == [("x_message_id", "m1"), ("x-group-id", "g1"), ("x-trace", "t")]
    assert content_type == "text/plain"


def test_a_producer_content_type_is_kept_and_a_broken_one_refused() -> None:
    envelope = single_envelope(
        [("X_MESSAGE_ID", "m")],
        b"{}",
        grouped=False,
        produced_at_ms=1,
        content_type=" application/json; charset=utf-8 ",
    )
    assert envelope.content_type == "application/json; charset=utf-8"
    assert ("setu-content-type", b"application/json; charset=utf-8") in envelope.kafka_headers()
    assert (
        single_envelope(
            [("X_MESSAGE_ID", "m")], b"", grouped=False, produced_at_ms=1, content_type=""
        ).content_type
        is None
    )
    for bad in ("text/plain\r\nX-Evil: 1", "t/" + "x" * 300):
        with pytest.raises(InvalidInput, match="Content-Type"):
            single_envelope(
                [("X_MESSAGE_ID", "m")], b"", grouped=False, produced_at_ms=1, content_type=bad
            )


def test_a_batch_message_may_name_its_content_type() -> None:
    payload = orjson.dumps(
        {
            "messages": [
                {"message_id": "a", "body": "{}", "content_type": "application/json"},
                {"message_id": "b", "body": "x"},
            ]
        }
    )
    a, b = parse_batch(
        payload, grouped=False, produced_at_ms=1, max_message_bytes=100, max_messages=10
    )
    assert ("setu-content-type", b"application/json") in a.headers
    assert not any(name == "setu-content-type" for name, _ in b.headers)
    bad = orjson.dumps({"messages": [{"message_id": "a", "body": "", "content_type": 5}]})
    with pytest.raises(InvalidInput, match="content_type must be a string"):
        parse_batch(bad, grouped=False, produced_at_ms=1, max_message_bytes=100, max_messages=10)


@pytest.mark.parametrize(("raw", "length"), [([], None), ([(b"content-length", b"abc")], None)])
def test_missing_or_unreadable_content_length_is_none(
    raw: list[tuple[bytes, bytes]], length: int | None
) -> None:
    assert scan_headers(raw)[0] == length


@pytest.mark.parametrize(
    ("raw", "text"),
    [(b"plain", "plain"), ("café".encode(), "café"), (b"caf\xe9", "café")],
)
def test_header_values_decode_as_utf8_else_latin1(raw: bytes, text: str) -> None:
    assert decode_header_value(raw) == text


def test_single_envelope_carries_identity_headers_and_time() -> None:
    env = single_envelope(
        [("x_message_id", "m1"), ("x-group-id", "g1"), ("x-trace", "t")],
        b"body",
        grouped=True,
        produced_at_ms=42,
    )
    assert env == Envelope(
        message_id="m1", body=b"body", group_id="g1", headers=(("x-trace", "t"),), produced_at_ms=42
    )
    assert env.key == b"g1"


def test_single_produce_on_a_grouped_topic_needs_a_group() -> None:
    with pytest.raises(InvalidInput, match="X_GROUP_ID"):
        single_envelope([("x-message-id", "m1")], b"", grouped=True, produced_at_ms=1)


def test_oversized_forwarded_headers_are_refused() -> None:
    big = "v" * MAX_FORWARDED_HEADER_BYTES
    with pytest.raises(PayloadTooLarge, match="X_\\* headers"):
        single_envelope(
            [("x-message-id", "m1"), ("x-big", big)], b"", grouped=False, produced_at_ms=1
        )


def batch(
    *messages: Any, max_bytes: int = 100, max_messages: int = 10, grouped: bool = False
) -> list[IngestRecord]:
    payload = orjson.dumps({"messages": list(messages)})
    return parse_batch(
        payload,
        grouped=grouped,
        produced_at_ms=7,
        max_message_bytes=max_bytes,
        max_messages=max_messages,
    )


def record_of(env: Envelope) -> IngestRecord:
    return IngestRecord(env.message_id, env.key, env.body, env.kafka_headers())


def test_batch_messages_become_the_records_of_their_envelopes() -> None:
    got = batch(
        {"message_id": "m1", "group_id": "g", "body": "héllo", "headers": {"X-Trace": "t"}},
        {"message_id": "m2", "producer_id": "p", "sequence_id": 3, "body_base64": "AAEC"},
        {"message_id": "m3", "producer_id": "p", "sequence_id": "4", "body": ""},
    )
    assert got == [
        record_of(
            Envelope(
                "m1", "héllo".encode(), group_id="g", headers=(("X-Trace", "t"),), produced_at_ms=7
            )
        ),
        record_of(
            Envelope("m2", b"\x00\x01\x02", producer_id="p", sequence_id=3, produced_at_ms=7)
        ),
        record_of(Envelope("m3", b"", producer_id="p", sequence_id=4, produced_at_ms=7)),
    ]


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (b"not json", "not valid JSON"),
        (b"[]", "must be a JSON object"),
        (b'{"messages": {}}', "must be a JSON object"),
        (b'{"messages": [], "extra": 1}', "unknown batch fields"),
        (b'{"messages": []}', "at least one message"),
    ],
)
def test_malformed_batch_documents_are_refused(payload: bytes, message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        parse_batch(payload, grouped=False, produced_at_ms=1, max_message_bytes=10, max_messages=10)


@pytest.mark.parametrize(
    ("message", "error"),
    [
        ("m", "must be a JSON object"),
        # (named as the batch names them, not as headers)
        ({"body": "x"}, "^messages\\[1\\]: message_id is required"),
        ({"message_id": 5, "body": "x"}, "message_id must be a string"),
        ({"message_id": "m" * 101, "body": "x"}, "at most 100"),
        ({"message_id": "m"}, "exactly one of body and body_base64"),
        ({"message_id": "m", "body": "x", "body_base64": "eA=="}, "exactly one"),
        ({"message_id": "m", "body": 5}, "body must be a string"),
        ({"message_id": "m", "body_base64": "not base64!"}, "not valid base64"),
        ({"message_id": "m", "body": "x", "producer_id": "p"}, "producer_id and sequence_id go"),
        (
            {"message_id": "m", "body": "x", "producer_id": "p", "sequence_id": -1},
            "sequence_id.*0..",
        ),
        ({"message_id": "m", "body": "x", "producer_id": "p", "sequence_id": 1.5}, "integer"),
        ({"message_id": "m", "body": "x", "producer_id": "p", "sequence_id": True}, "integer"),
        ({"message_id": "m", "body": "x", "colour": "red"}, "unknown fields"),
        ({"message_id": "m", "body": "x", "headers": ["a"]}, "object of strings"),
        ({"message_id": "m", "body": "x", "headers": {"X-A": 1}}, "string value"),
        ({"message_id": "m", "body": "x", "headers": {"Trace": "t"}}, "start with X_"),
        ({"message_id": "m", "body": "x", "headers": {"X_GROUP_ID": "g"}}, "own field"),
        ({"message_id": "m", "body": "x", "headers": {"X-Delivery-Attempt": "1"}}, "set by Setu"),
        ({"message_id": "m", "body": "x", "headers": {"X-A": "a\nb"}}, "control characters"),
        ({"message_id": "m", "body": "x", "headers": {"X A": "b"}}, "header name"),
    ],
)
def test_bad_batch_messages_are_refused_by_index(message: Any, error: str) -> None:
    good = {"message_id": "ok", "body": "x"}
    with pytest.raises(InvalidInput, match=error) as raised:
        batch(good, message)
    assert raised.value.message.startswith("messages[1]: ")


def test_grouped_batch_needs_a_group_per_message() -> None:
    with pytest.raises(InvalidInput, match="messages\\[0\\]: group_id is required"):
        batch({"message_id": "m", "body": "x"}, grouped=True)


def test_body_over_the_limit_is_413_even_in_base64() -> None:
    encoded = base64.b64encode(b"x" * 11).decode()
    with pytest.raises(PayloadTooLarge, match="messages\\[0\\]"):
        batch({"message_id": "m", "body_base64": encoded}, max_bytes=10)


def test_too_many_messages_is_413() -> None:
    with pytest.raises(PayloadTooLarge, match="at most 2"):
        batch(*({"message_id": f"m{i}", "body": ""} for i in range(3)), max_messages=2)


@pytest.mark.parametrize(
    ("errors", "status"),
    [([None, None], 200), ([None, "e"], 207), (["e", "e"], 503), (["e"], 503), ([None], 200)],
)
def test_batch_status(errors: list[str | None], status: int) -> None:
    assert batch_status(errors) == status


ids = st.text(min_size=1, max_size=100)


@given(
    message_id=ids,
    group_id=st.none() | ids,
    producer=st.none() | st.tuples(ids, st.integers(0, 2**63 - 1)),
    extra=st.lists(st.tuples(st.from_regex(r"X-[A-Za-z]{1,8}", fullmatch=True), st.text())),
    produced_at_ms=st.integers(0, 2**45),
    created_at_ms=st.integers(0, 2**45),
    window_seconds=st.sampled_from([0, 300, 86_400]),
)
def test_ingest_headers_are_exactly_the_envelopes(
    message_id: str,
    group_id: str | None,
    producer: tuple[str, int] | None,
    extra: list[tuple[str, str]],
    produced_at_ms: int,
    created_at_ms: int,
    window_seconds: int,
) -> None:
    producer_id, sequence_id = producer or (None, None)
    window_ms = dedup_window_for(producer_id, window_seconds)
    incarnation = incarnation_for(producer_id, created_at_ms, window_ms)
    envelope = Envelope(
        message_id,
        b"",
        group_id=group_id,
        producer_id=producer_id,
        sequence_id=sequence_id,
        headers=tuple(extra),
        produced_at_ms=produced_at_ms,
        topic_incarnation=incarnation,
        dedup_window_ms=window_ms,
    )
    built = ingest_headers(
        message_id,
        group_id,
        producer_id,
        sequence_id,
        extra,
        produced_at_ms,
        incarnation,
        dedup_window_ms=window_ms,
    )
    assert built == envelope.kafka_headers()
    assert Envelope.from_kafka(built, b"") == envelope


def test_only_a_message_with_a_producer_id_carries_its_topics_incarnation() -> None:
    def produced(*x_headers: tuple[str, str]) -> Envelope:
        return single_envelope(
            [("x-message-id", "m1"), *x_headers],
            b"",
            grouped=False,
            produced_at_ms=1,
            topic_created_at_ms=1_700_000_000_000,
        )

    with_producer = produced(("x-producer-id", "p"), ("x-sequence-id", "3"))
    assert with_producer.topic_incarnation == 1_700_000_000_000
    assert (H_TOPIC_INCARNATION, b"1700000000000") in with_producer.kafka_headers()
    assert produced().topic_incarnation == 0
    [record] = parse_batch(
        b'{"messages":[{"message_id":"m","producer_id":"p","sequence_id":1,"body":""}]}',
        grouped=False,
        produced_at_ms=1,
        max_message_bytes=10,
        max_messages=10,
        topic_created_at_ms=7,
    )
    assert (H_TOPIC_INCARNATION, b"7") in record.headers


def test_a_message_without_a_producer_id_carries_its_topics_message_id_window() -> None:
    def produced(window_seconds: int, *x_headers: tuple[str, str]) -> Envelope:
        return single_envelope(
            [("x-message-id", "m1"), *x_headers],
            b"",
            grouped=False,
            produced_at_ms=1,
            topic_created_at_ms=1_700_000_000_000,
            dedup_window_seconds=window_seconds,
        )

    # Judged by message id: the window and the topic's life, to tell a topic created again
    plain = produced(300)
    assert (H_DEDUP_WINDOW, b"300000") in plain.kafka_headers()
    assert plain.topic_incarnation == 1_700_000_000_000
    # Judged by sequence: no window
    sequenced = produced(300, ("x-producer-id", "p"), ("x-sequence-id", "3"))
    assert sequenced.dedup_window_ms == 0
    assert all(name != H_DEDUP_WINDOW for name, _ in sequenced.kafka_headers())
    # A topic without a window: neither
    assert (produced(0).dedup_window_ms, produced(0).topic_incarnation) == (0, 0)
    [record] = parse_batch(
        b'{"messages":[{"message_id":"m","body":""}]}',
        grouped=False,
        produced_at_ms=1,
        max_message_bytes=10,
        max_messages=10,
        topic_created_at_ms=7,
        dedup_window_seconds=60,
    )
    assert (H_DEDUP_WINDOW, b"60000") in record.headers
    assert (H_TOPIC_INCARNATION, b"7") in record.headers


def test_batch_results_name_each_message() -> None:
    records = [IngestRecord("a", b"a", b"", []), IngestRecord("b", b"b", b"", [])]
    assert batch_results(records, [None, "timed out"]) == [
        {"message_id": "a", "status": "ok"},
        {"message_id": "b", "status": "error", "error": "timed out"},
    ]


TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def test_a_streamed_header_block_carries_x_headers_content_type_and_trace_as_http_does() -> None:
    given = streamed_headers(
        [
            (b"X_REGION", b"eu"),
            (b"x-tier", "g\u00f6ld".encode()),
            (b"Content-Type", b"application/json"),
            (b"traceparent", TRACEPARENT.encode()),
            (b"tracestate", b"k=v"),
        ]
    )
    assert given.extra == (("X_REGION", "eu"), ("x-tier", "g\u00f6ld"))
    assert (given.content_type, given.traceparent, given.tracestate) == (
        "application/json",
        TRACEPARENT,
        "k=v",
    )
    # And the record's headers are what an HTTP-produced envelope of the same message has
    built = ingest_headers(
        "p:3", "g", "p", 3, given.extra, 1000, 77, given.content_type
    ) + trace_headers(given.traceparent, given.tracestate)
    envelope = Envelope(
        "p:3",
        b"",
        group_id="g",
        producer_id="p",
        sequence_id=3,
        headers=given.extra,
        produced_at_ms=1000,
        topic_incarnation=77,
        content_type="application/json",
        traceparent=TRACEPARENT,
        tracestate="k=v",
    )
    assert built == envelope.kafka_headers()


@pytest.mark.parametrize(
    ("block", "error"),
    [
        ([(b"X_GROUP_ID", b"g")], "use the frame's own fields instead"),
        ([(b"X_DELIVERY_ATTEMPT", b"2")], "is set by Setu"),
        ([(b"authorization", b"x")], "must start with X_ or X-"),
        ([(b"X_BAD", b"a\r\nb")], "control characters"),
        ([(b"content-type", b"x" * 300)], "Content-Type is longer than"),
    ],
)
def test_a_streamed_header_block_is_held_to_http_produces_rules(
    block: list[tuple[bytes, bytes]], error: str
) -> None:
    with pytest.raises(InvalidInput, match=error):
        streamed_headers(block)


def test_streamed_x_headers_have_http_produces_size_limit() -> None:
    block = [
        (f"X_H{n}".encode(), b"v" * 1000) for n in range(MAX_FORWARDED_HEADER_BYTES // 1000 + 1)
    ]
    with pytest.raises(PayloadTooLarge, match="X_\\* headers take"):
        streamed_headers(block)


DAY_MS = 86_400_000


def scheduled(*x_headers: tuple[str, str], limit_ms: int = DAY_MS) -> Envelope:
    return single_envelope(
        [("x-message-id", "m1"), ("x-group-id", "g"), *x_headers],
        b"",
        grouped=True,
        produced_at_ms=1_000_000,
        schedule_limit_ms=limit_ms,
    )


def test_a_message_scheduled_at_a_time_or_after_a_delay_carries_that_time() -> None:
    # docs/scheduling.md: either header, in either spelling, becomes one absolute time
    assert scheduled(("X_DELIVER_AT", "1060000")).deliver_at_ms == 1_060_000
    assert scheduled(("x-deliver-after-ms", "60000")).deliver_at_ms == 1_060_000
    # and it is not forwarded as the producer's own header (the call carries X_DELIVER_AT)
    envelope = scheduled(("X-Deliver-At", "1060000"), ("X-Other", "v"))
    assert envelope.headers == (("X-Other", "v"),)
    assert Envelope.from_kafka(envelope.kafka_headers(), b"").deliver_at_ms == 1_060_000


def test_a_time_already_past_is_delivered_at_once() -> None:
    assert scheduled(("X_DELIVER_AT", "5")).deliver_at_ms == 0
    assert scheduled(("X_DELIVER_AFTER_MS", "0")).deliver_at_ms == 0


@pytest.mark.parametrize(
    ("headers", "says"),
    [
        ((("X_DELIVER_AT", "soon"),), "whole number"),
        ((("X_DELIVER_AT", "-5"),), "whole number"),
        ((("X_DELIVER_AT", "1e9"),), "whole number"),
        ((("X_DELIVER_AT", "10"), ("X_DELIVER_AFTER_MS", "10")), "not both"),
        ((("X_DELIVER_AT", "10"), ("X-Deliver-At", "11")), "twice"),
        ((("X_DELIVER_AFTER_MS", str(DAY_MS + 1)),), "limit"),
    ],
)
def test_a_bad_or_too_distant_time_is_refused(
    headers: tuple[tuple[str, str], ...], says: str
) -> None:
    with pytest.raises(InvalidInput, match=says):
        scheduled(*headers)


def test_a_message_of_an_ungrouped_topic_cannot_be_scheduled() -> None:
    # Its waiting keeps its group's order: an ungrouped topic's messages have none
    with pytest.raises(InvalidInput, match="grouped topics"):
        scheduled(("X_DELIVER_AFTER_MS", "1000"), limit_ms=0)


def test_the_limit_is_the_setting_within_the_topics_retention() -> None:
    topic = Topic("p", "t", grouped=True, retention_hours=24)
    assert schedule_limit_ms(topic, 7 * DAY_MS) == 23 * 3_600_000
    assert schedule_limit_ms(topic, 60_000) == 60_000
    assert schedule_limit_ms(replace(topic, grouped=False), 60_000) == 0
    # A short retention keeps half of itself for the message's wait
    assert schedule_limit_ms(replace(topic, retention_hours=1), 7 * DAY_MS) == 1_800_000


def test_a_batch_message_is_scheduled_by_its_own_headers() -> None:
    payload = orjson.dumps(
        {
            "messages": [
                {
                    "message_id": "m1",
                    "group_id": "g",
                    "body": "x",
                    "headers": {"X_DELIVER_AFTER_MS": "1000"},
                },
                {"message_id": "m2", "group_id": "g", "body": "y"},
            ]
        }
    )
    first, second = parse_batch(
        payload,
        grouped=True,
        produced_at_ms=5_000,
        max_message_bytes=1024,
        max_messages=10,
        schedule_limit_ms=DAY_MS,
    )
    assert Envelope.from_kafka(first.headers, b"").deliver_at_ms == 6_000
    assert Envelope.from_kafka(second.headers, b"").deliver_at_ms == 0
