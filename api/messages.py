"""Produce requests turned into envelopes: pure functions, no I/O (docs/design.md §2, §5).

Single produce: the body is the message, headers carry its identity. Batch produce: a JSON
document ``{"messages": [{message_id, group_id?, producer_id?, sequence_id?, headers?,
body | body_base64}]}``; ``body`` is text (sent as its UTF-8 bytes), ``body_base64`` carries
binary. A batch is validated as a whole before anything is produced, so a bad message changes
nothing; errors name the message by index. Batch messages become Kafka records directly
(:func:`ingest_headers` writes what ``Envelope.kafka_headers`` would), since building a frozen
envelope per message costs as much as producing it.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import orjson

from api.validation import check_header
from setu import headers as rules
from setu.envelope import (
    H_CONTENT_TYPE,
    H_DEDUP_WINDOW,
    H_DELIVER_AT,
    H_GROUP_ID,
    H_MESSAGE_ID,
    H_PRODUCED_AT,
    H_PRODUCER_ID,
    H_SEQUENCE_ID,
    H_TOPIC_INCARNATION,
    H_TRACEPARENT,
    H_TRACESTATE,
    Envelope,
    KafkaHeaders,
    kafka_key,
)
from setu.errors import InvalidInput, PayloadTooLarge, SetuError
from setu.limits import MAX_FORWARDED_HEADER_BYTES
from setu.model import Topic

# Producer headers travel with the message into every Kafka record and webhook call.

_BATCH_FIELDS = frozenset(
    {
        "message_id",
        "group_id",
        "producer_id",
        "sequence_id",
        "headers",
        "body",
        "body_base64",
        "content_type",
    }
)
MAX_CONTENT_TYPE_CHARS = 255


class IngestRecord(NamedTuple):
    """One message of a batch as its Kafka record for the ingest topic."""

    message_id: str
    key: bytes
    value: bytes
    headers: KafkaHeaders


def ingest_headers(
    message_id: str,
    group_id: str | None,
    producer_id: str | None,
    sequence_id: int | None,
    extra: Sequence[tuple[str, str]],
    produced_at_ms: int,
    topic_incarnation: int = 0,
    content_type: str | None = None,
    dedup_window_ms: int = 0,
    deliver_at_ms: int = 0,
) -> KafkaHeaders:
    """Exactly ``Envelope(...).kafka_headers()`` of a message just produced (no audit fields);
    ``topic_incarnation`` and ``dedup_window_ms`` as :func:`incarnation_for` and
    :func:`dedup_window_for` give them."""
    out: KafkaHeaders = [(name, value.encode()) for name, value in extra]
    out.append((H_MESSAGE_ID, message_id.encode()))
    if group_id is not None:
        out.append((H_GROUP_ID, group_id.encode()))
    if producer_id is not None:
        out.append((H_PRODUCER_ID, producer_id.encode()))
    if sequence_id is not None:
        out.append((H_SEQUENCE_ID, str(sequence_id).encode()))
    if produced_at_ms:
        out.append((H_PRODUCED_AT, str(produced_at_ms).encode()))
    if topic_incarnation:
        out.append((H_TOPIC_INCARNATION, str(topic_incarnation).encode()))
    if dedup_window_ms:
        out.append((H_DEDUP_WINDOW, str(dedup_window_ms).encode()))
    if content_type is not None:
        out.append((H_CONTENT_TYPE, content_type.encode()))
    if deliver_at_ms:
        out.append((H_DELIVER_AT, str(deliver_at_ms).encode()))
    return out


def schedule_limit_ms(topic: Topic, max_delay_ms: int) -> int:
    """How far ahead a message of ``topic`` may be scheduled (docs/scheduling.md): 0 on an
    ungrouped topic; else the setting, and within the topic's retention less an hour (less
    half of it, for a retention of two hours or less), so its record is still in the main log
    when it is due."""
    if not topic.grouped:
        return 0
    retention_ms = topic.retention_hours * 3_600_000
    kept = max(retention_ms // 2, retention_ms - 3_600_000)
    return min(max_delay_ms, kept)


def incarnation_for(producer_id: str | None, topic_created_at_ms: int, window_ms: int = 0) -> int:
    """The topic incarnation a message carries: only a message that is de-duplicated needs
    one, by producer id or by message id within ``window_ms`` (docs/ingest.md, "A topic
    created again")."""
    return topic_created_at_ms if producer_id is not None or window_ms else 0


def dedup_window_for(producer_id: str | None, window_seconds: int) -> int:
    """The window (ms) a message is de-duplicated by message id in: its topic's, unless it has
    a producer id, which de-duplicates it by sequence instead (docs/ingest.md)."""
    return 0 if producer_id is not None else window_seconds * 1000


def decode_header_value(raw: bytes) -> str:
    """HTTP header values are bytes; UTF-8 when they decode as such, else Latin-1."""
    try:
        return raw.decode()
    except UnicodeDecodeError:
        return raw.decode("latin-1")


class ScannedHeaders(NamedTuple):
    # The declared Content-Length; None if absent or unreadable.
    length: int | None
    # The X-*/X_* headers, decoded, in order.
    found: list[tuple[str, str]]
    # The request's Content-Type as given (checked by check_content_type), None if absent.
    content_type: str | None
    # The request's W3C trace context as given (setu/tracing.py checks it), None if absent.
    traceparent: str | None = None
    tracestate: str | None = None


def scan_headers(raw: Iterable[tuple[bytes, bytes]]) -> ScannedHeaders:
    """What produce reads from ASGI headers: Content-Length, Content-Type, the trace context
    and ``X_*``."""
    length: int | None = None
    content_type = traceparent = tracestate = None
    found: list[tuple[str, str]] = []
    for name, value in raw:
        prefix = name[:2].lower()
        if prefix in (b"x-", b"x_"):
            found.append((name.decode("latin-1"), decode_header_value(value)))
        else:
            lowered = name.lower()
            if lowered == b"content-length" and value.isdigit():
                length = int(value)
            elif lowered == b"content-type":
                content_type = decode_header_value(value)
            elif lowered == b"traceparent":
                traceparent = value.decode("latin-1")
            elif lowered == b"tracestate":
                tracestate = value.decode("latin-1")
    return ScannedHeaders(length, found, content_type, traceparent, tracestate)


def check_content_type(value: str | None) -> str | None:
    """A producer's Content-Type as it will be sent to webhooks: one line of visible text."""
    if value is None:
        return None
    value = value.strip()
    if not value:
        return None
    if len(value) > MAX_CONTENT_TYPE_CHARS:
        raise InvalidInput(f"Content-Type is longer than {MAX_CONTENT_TYPE_CHARS} characters")
    check_header("Content-Type", "Content-Type", value)
    return value


def check_body_size(size: int, limit: int) -> None:
    if size > limit:
        raise PayloadTooLarge(f"message body is over the limit of {limit} bytes")


def check_forwarded_size(extra: Sequence[tuple[str, str]]) -> None:
    size = sum(len(name) + len(value.encode()) for name, value in extra)
    if size > MAX_FORWARDED_HEADER_BYTES:
        raise PayloadTooLarge(
            f"X_* headers take {size} bytes, over the limit of {MAX_FORWARDED_HEADER_BYTES}"
        )


def single_envelope(
    x_headers: Iterable[tuple[str, str]],
    body: bytes,
    *,
    grouped: bool,
    produced_at_ms: int,
    topic_created_at_ms: int = 0,
    content_type: str | None = None,
    dedup_window_seconds: int = 0,
    schedule_limit_ms: int = 0,
) -> Envelope:
    """The envelope of a single produce; raises InvalidInput or PayloadTooLarge."""
    parsed = rules.parse_produce_headers(x_headers, grouped=grouped)
    deliver_at, extra = rules.scheduled_at(parsed.extra, produced_at_ms, schedule_limit_ms)
    check_forwarded_size(extra)
    window_ms = dedup_window_for(parsed.producer_id, dedup_window_seconds)
    return Envelope(
        message_id=parsed.message_id,
        body=body,
        group_id=parsed.group_id,
        producer_id=parsed.producer_id,
        sequence_id=parsed.sequence_id,
        headers=extra,
        produced_at_ms=produced_at_ms,
        topic_incarnation=incarnation_for(parsed.producer_id, topic_created_at_ms, window_ms),
        dedup_window_ms=window_ms,
        content_type=check_content_type(content_type),
        deliver_at_ms=deliver_at,
    )


def parse_batch(
    payload: bytes,
    *,
    grouped: bool,
    produced_at_ms: int,
    max_message_bytes: int,
    max_messages: int,
    topic_created_at_ms: int = 0,
    dedup_window_seconds: int = 0,
    schedule_limit_ms: int = 0,
) -> list[IngestRecord]:
    """Every message of a batch body as its record; raises on the first bad message."""
    try:
        document = orjson.loads(payload)
    except orjson.JSONDecodeError as exc:
        raise InvalidInput(f"batch body is not valid JSON: {exc}") from None
    if not isinstance(document, dict) or not isinstance(document.get("messages"), list):
        raise InvalidInput('batch body must be a JSON object {"messages": [...]}')
    unknown = document.keys() - {"messages"}
    if unknown:
        raise InvalidInput(f"unknown batch fields: {sorted(unknown)}")
    messages = document["messages"]
    if not messages:
        raise InvalidInput("a batch needs at least one message")
    if len(messages) > max_messages:
        raise PayloadTooLarge(f"a batch holds at most {max_messages} messages")
    out = []
    for index, message in enumerate(messages):
        try:
            out.append(
                _batch_message(
                    message,
                    grouped,
                    produced_at_ms,
                    max_message_bytes,
                    topic_created_at_ms,
                    dedup_window_seconds,
                    schedule_limit_ms,
                )
            )
        except SetuError as exc:
            raise type(exc)(f"messages[{index}]: {exc.message}") from None
    return out


def _batch_message(
    message: Any,
    grouped: bool,
    produced_at_ms: int,
    max_message_bytes: int,
    topic_created_at_ms: int,
    dedup_window_seconds: int = 0,
    schedule_limit_ms: int = 0,
) -> IngestRecord:
    # Runs once per message of every batch: checks are inlined where a call would cost more.
    if not isinstance(message, dict):
        raise InvalidInput("must be a JSON object")
    if not _BATCH_FIELDS.issuperset(message):
        raise InvalidInput(f"unknown fields {sorted(message.keys() - _BATCH_FIELDS)}")
    get = message.get
    sequence = get("sequence_id")
    if sequence is not None and not isinstance(sequence, int | str):
        raise InvalidInput("sequence_id must be an integer")
    message_id, group_id, producer_id, sequence_id = rules.check_identity(
        _text(get("message_id"), "message_id"),
        _text(get("group_id"), "group_id"),
        _text(get("producer_id"), "producer_id"),
        sequence,
        grouped=grouped,
        names=rules.FIELD_NAMES,
    )
    extra: tuple[tuple[str, str], ...] = ()
    deliver_at = 0
    if get("headers") is not None:
        extra = producer_headers(get("headers"))
        deliver_at, extra = rules.scheduled_at(extra, produced_at_ms, schedule_limit_ms)
        check_forwarded_size(extra)
    text = get("body")
    if isinstance(text, str) and "body_base64" not in message:
        body = text.encode()
    else:
        body = sample_body(message)
    if len(body) > max_message_bytes:
        check_body_size(len(body), max_message_bytes)
    key = kafka_key(message_id, group_id)
    window_ms = dedup_window_for(producer_id, dedup_window_seconds)
    headers = ingest_headers(
        message_id,
        group_id,
        producer_id,
        sequence_id,
        extra,
        produced_at_ms,
        incarnation_for(producer_id, topic_created_at_ms, window_ms),
        check_content_type(_text(get("content_type"), "content_type")),
        window_ms,
        deliver_at,
    )
    return IngestRecord(message_id, key, body, headers)


def _text(value: Any, field: str) -> str | None:
    if value is not None and not isinstance(value, str):
        raise InvalidInput(f"{field} must be a string")
    return value


def sample_body(message: dict[str, Any]) -> bytes:
    """A message's body as a JSON document gives it: ``body`` (text) or ``body_base64``."""
    text, encoded = message.get("body"), message.get("body_base64")
    if (text is None) == (encoded is None):
        raise InvalidInput("give exactly one of body and body_base64")
    if text is not None:
        if not isinstance(text, str):
            raise InvalidInput("body must be a string; use body_base64 for binary")
        return text.encode()
    if not isinstance(encoded, str):
        raise InvalidInput("body_base64 must be a string")
    try:
        return base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidInput("body_base64 is not valid base64") from None


def producer_headers(headers: Any) -> tuple[tuple[str, str], ...]:
    """A batch message's own ``X_*`` headers, under the rules of single produce."""
    if headers is None:
        return ()
    if not isinstance(headers, dict):
        raise InvalidInput("headers must be an object of strings")
    out = []
    for name, value in headers.items():
        if not isinstance(value, str):
            raise InvalidInput(f"header {name!r} must have a string value")
        check_producer_header(name, value, "the message's own field")
        out.append((name, value))
    return tuple(out)


def check_producer_header(name: str, value: str, identity_in: str) -> None:
    """An ``X_*`` header a message carries to its webhook, sent apart from its identity (batch
    produce and streams name the identity in fields of their own, ``identity_in``)."""
    check_header("headers", name, value)
    key = rules.canonical(name)
    if not key.startswith("X_"):
        raise InvalidInput(f"header {name!r} must start with X_ or X-")
    if key in rules.IDENTITY_HEADERS:
        raise InvalidInput(f"header {name!r}: use {identity_in} instead")
    if key in rules.RESERVED_HEADERS:
        raise InvalidInput(f"header {name!r} is set by Setu and may not be produced")


class StreamedHeaders(NamedTuple):
    """What a streamed MESSAGE's header block carries (docs/streaming.md, "Headers")."""

    extra: tuple[tuple[str, str], ...] = ()
    content_type: str | None = None
    traceparent: str | None = None
    tracestate: str | None = None


def streamed_headers(block: Iterable[tuple[bytes, bytes]]) -> StreamedHeaders:
    """A MESSAGE's header block under the rules of HTTP produce: ``X_*`` headers, the
    Content-Type and the trace context (a malformed one is dropped, as HTTP's is)."""
    extra: list[tuple[str, str]] = []
    content_type = traceparent = tracestate = None
    for raw_name, raw_value in block:
        name, value = raw_name.decode("latin-1"), decode_header_value(raw_value)
        lowered = name.lower()
        if lowered == "content-type":
            content_type = check_content_type(value)
        elif lowered == "traceparent":
            traceparent = value
        elif lowered == "tracestate":
            tracestate = value
        else:
            check_producer_header(name, value, "the frame's own fields")
            extra.append((name, value))
    check_forwarded_size(extra)
    return StreamedHeaders(tuple(extra), content_type, traceparent, tracestate)


def trace_headers(traceparent: str | None, tracestate: str | None) -> KafkaHeaders:
    """The Kafka headers of a message's trace context (setu/tracing.py): none without a
    traceparent."""
    if traceparent is None:
        return []
    out: KafkaHeaders = [(H_TRACEPARENT, traceparent.encode())]
    if tracestate is not None:
        out.append((H_TRACESTATE, tracestate.encode()))
    return out


def batch_status(errors: Sequence[str | None]) -> int:
    """200 when every message was acknowledged, 503 when none was, else 207 Multi-Status."""
    failed = sum(error is not None for error in errors)
    if failed == 0:
        return 200
    return 503 if failed == len(errors) else 207


def batch_results(records: Sequence[IngestRecord], errors: Sequence[str | None]) -> list[Any]:
    return [
        {"message_id": record.message_id, "status": "ok"}
        if error is None
        else {"message_id": record.message_id, "status": "error", "error": error}
        for record, error in zip(records, errors, strict=True)
    ]
