"""The message envelope: how one message travels through every Kafka topic of Setu.

The Kafka record value is the body exactly as published. Kafka headers carry the producer's own
``X_*`` headers under their own names plus Setu's headers (all prefixed ``setu-``), so every
stage can be audited and replayed from the records alone.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

SETU_PREFIX = "setu-"
H_MESSAGE_ID = "setu-message-id"
H_GROUP_ID = "setu-group-id"
H_PRODUCER_ID = "setu-producer-id"
H_SEQUENCE_ID = "setu-sequence-id"
H_PRODUCED_AT = "setu-produced-at"
H_INGEST_PARTITION = "setu-ingest-partition"
H_INGEST_OFFSET = "setu-ingest-offset"
# The shared ingest log a main record came from (decision 0010); absent when it came from its
# topic's own ingest topic. Delivery tells a replay by ingest partition and offset, and the two
# logs' partitions are different partitions (delivery/replays.py).
H_INGEST_LOG = "setu-ingest-log"
# On a record of the shared ingest log: its topic's main log, which the ingest job writes it to.
H_TOPIC = "setu-topic"
H_ATTEMPT = "setu-attempt"
H_FAILURE_REASON = "setu-failure-reason"
H_LAST_STATUS = "setu-last-status"
H_FAILED_AT = "setu-failed-at"
H_MAIN_OFFSET = "setu-main-offset"
# When the producer asked for the message to be delivered, epoch ms (docs/scheduling.md).
H_DELIVER_AT = "setu-deliver-at"
# The producer's Content-Type, sent to the webhook as the call's own (docs/policies.md §7).
H_CONTENT_TYPE = "setu-content-type"
# Which life of its topic a message with a producer id was produced to: the topic's creation
# time. De-duplication state and producer marks of a deleted topic never judge or answer for
# a topic created again under the same name (docs/ingest.md, "A topic created again").
H_TOPIC_INCARNATION = "setu-topic-incarnation"
# On a message without a producer id: its topic's window for de-duplication by message id, in ms
# (docs/ingest.md, "De-duplication by message id"). The topic's setting travels with each
# message, so the ingest job needs no lookup.
H_DEDUP_WINDOW = "setu-dedup-window-ms"
# W3C Trace Context of the message (setu/tracing.py), under the names OpenTelemetry's Kafka
# instrumentations read: not Setu-prefixed, and never forwarded as a producer header.
H_TRACEPARENT = "traceparent"
H_TRACESTATE = "tracestate"
TRACE_HEADERS = frozenset({H_TRACEPARENT, H_TRACESTATE})
# Why the ingest job set a record aside in its topic's ingest reject topic (spark.rejects)
H_REJECT_REASON = "setu-reject-reason"

KafkaHeaders = list[tuple[str, bytes]]


def kafka_key(message_id: str, group_id: str | None) -> bytes:
    """The Kafka key of a message: its GroupId, else its MessageId (docs/design.md §1). The one
    home of the rule; the ingest job keeps a column-expression copy that a test holds equal
    (``spark.stream.key_column``)."""
    return (group_id if group_id is not None else message_id).encode()


@dataclass(frozen=True, slots=True)
class Envelope:
    """One message with its identity and its audit trail. Immutable: use :meth:`evolve`."""

    message_id: str
    body: bytes
    group_id: str | None = None
    producer_id: str | None = None
    sequence_id: int | None = None
    headers: tuple[tuple[str, str], ...] = ()
    produced_at_ms: int = 0
    topic_incarnation: int = 0
    dedup_window_ms: int = 0
    content_type: str | None = None
    ingest_partition: int | None = None
    ingest_offset: int | None = None
    ingest_log: str | None = None
    main_offset: int | None = None
    attempt: int = 0
    failure_reason: str | None = None
    last_status: int | None = None
    failed_at_ms: int | None = None
    traceparent: str | None = None
    tracestate: str | None = None
    deliver_at_ms: int = 0  # not before (epoch ms); 0: at once

    @property
    def key(self) -> bytes:
        """The Kafka key (:func:`kafka_key`)."""
        return kafka_key(self.message_id, self.group_id)

    def evolve(self, **changes: object) -> Envelope:
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]

    def kafka_headers(self) -> KafkaHeaders:
        """All headers for a Kafka record of this message; producer headers first."""
        # Called once per produced record, so plain appends rather than a generator.
        out: KafkaHeaders = [(name, value.encode()) for name, value in self.headers]
        out.append((H_MESSAGE_ID, self.message_id.encode()))
        if self.group_id is not None:
            out.append((H_GROUP_ID, self.group_id.encode()))
        if self.producer_id is not None:
            out.append((H_PRODUCER_ID, self.producer_id.encode()))
        if self.sequence_id is not None:
            out.append((H_SEQUENCE_ID, str(self.sequence_id).encode()))
        if self.produced_at_ms:
            out.append((H_PRODUCED_AT, str(self.produced_at_ms).encode()))
        if self.topic_incarnation:
            out.append((H_TOPIC_INCARNATION, str(self.topic_incarnation).encode()))
        if self.dedup_window_ms:
            out.append((H_DEDUP_WINDOW, str(self.dedup_window_ms).encode()))
        if self.content_type is not None:
            out.append((H_CONTENT_TYPE, self.content_type.encode()))
        if self.traceparent is not None:
            out.append((H_TRACEPARENT, self.traceparent.encode()))
            if self.tracestate is not None:
                out.append((H_TRACESTATE, self.tracestate.encode()))
        optional: tuple[tuple[str, object | None], ...] = (
            (H_INGEST_PARTITION, self.ingest_partition),
            (H_INGEST_OFFSET, self.ingest_offset),
            (H_INGEST_LOG, self.ingest_log),
            (H_MAIN_OFFSET, self.main_offset),
            (H_ATTEMPT, self.attempt or None),
            (H_FAILURE_REASON, self.failure_reason),
            (H_LAST_STATUS, self.last_status),
            (H_FAILED_AT, self.failed_at_ms),
            (H_DELIVER_AT, self.deliver_at_ms or None),
        )
        for name, value in optional:
            if value is not None:
                out.append((name, str(value).encode()))
        return out

    @classmethod
    def from_kafka(
        cls, headers: Sequence[tuple[str, bytes | None]] | None, body: bytes | None
    ) -> Envelope:
        """Rebuild an envelope from a Kafka record; raises ValueError without a message id."""
        own: dict[str, str] = {}
        extra: list[tuple[str, str]] = []
        for name, raw in headers or ():
            value = (raw or b"").decode("utf-8", "replace")
            if name.startswith(SETU_PREFIX) or name in TRACE_HEADERS:
                own[name] = value
            else:
                extra.append((name, value))
        if H_MESSAGE_ID not in own:
            raise ValueError("record has no setu-message-id header")

        def num(name: str) -> int | None:
            return int(own[name]) if name in own else None

        return cls(
            message_id=own[H_MESSAGE_ID],
            body=body or b"",
            group_id=own.get(H_GROUP_ID),
            producer_id=own.get(H_PRODUCER_ID),
            sequence_id=num(H_SEQUENCE_ID),
            headers=tuple(extra),
            produced_at_ms=num(H_PRODUCED_AT) or 0,
            topic_incarnation=num(H_TOPIC_INCARNATION) or 0,
            dedup_window_ms=num(H_DEDUP_WINDOW) or 0,
            content_type=own.get(H_CONTENT_TYPE),
            ingest_partition=num(H_INGEST_PARTITION),
            ingest_offset=num(H_INGEST_OFFSET),
            ingest_log=own.get(H_INGEST_LOG),
            main_offset=num(H_MAIN_OFFSET),
            attempt=num(H_ATTEMPT) or 0,
            failure_reason=own.get(H_FAILURE_REASON),
            last_status=num(H_LAST_STATUS),
            failed_at_ms=num(H_FAILED_AT),
            traceparent=own.get(H_TRACEPARENT),
            tracestate=own.get(H_TRACESTATE),
            deliver_at_ms=num(H_DELIVER_AT) or 0,
        )
