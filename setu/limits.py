"""Every size limit along a message's path, derived from one setting (docs/limits.md).

``SETU_MAX_MESSAGE_BYTES`` is the largest body the API accepts. Every later stage must carry
whatever the API accepted, or one accepted message stops a whole pipeline (the ingest job
replaying the same batch forever, a worker failing to copy a record to a retry tier). So no
stage sets a size limit of its own: each takes it from :class:`MessageLimits`.

The HTTP server's own limits (a request's head, its time, the body of each route) are here too:
docs/limits.md lists them all.
"""

from __future__ import annotations

from dataclasses import dataclass

KIB = 1024
DEFAULT_MAX_MESSAGE_BYTES = 1024 * KIB  # SETU_MAX_MESSAGE_BYTES when unset

# The producer's own X_* headers, names and values together, as the API counts them.
MAX_FORWARDED_HEADER_BYTES = 32 * KIB
# Room above the body for every header a record ever carries: the producer's X_* headers,
# its ids (100 characters each at most), Setu's own headers (ingest position, produce time,
# attempt, failure reason, origin, epoch) and the record's framing.
HEADER_ALLOWANCE_BYTES = 64 * KIB
# The largest batch of records any Setu producer builds (librdkafka's default batch.size is
# 1,000,000 bytes; the ingest job's sink uses 256 KiB): a topic must take a full batch too.
MAX_BATCH_BYTES = 1_000_000
# An HTTP request's line and headers together: above it the API answers 431 (api/server.py).
# Room for the producer's X_* headers (MAX_FORWARDED_HEADER_BYTES) and everything else.
MAX_REQUEST_HEAD_BYTES = 64 * KIB
# How long a request head may take to arrive in full before the connection is closed
# (SETU_HTTP_HEAD_TIMEOUT_MS when unset; api/server.py).
DEFAULT_HTTP_HEAD_TIMEOUT_MS = 10_000
# The body of every route but produce (projects, topics, subscriptions, keys, operator
# actions): above it the API answers 413 (api/gate.py). The largest body their schemas
# allow fits: an unsideline list of 10,000 ids of 100 characters (about 1,030,000 bytes), a
# subscription with 64 endpoint headers of 8 KiB (about 530,000 bytes).
MAX_CONTROL_BODY_BYTES = 1024 * KIB
# A produce request's framing around its record batches.
REQUEST_OVERHEAD_BYTES = 16 * KIB
# The longest failure reason a delivery copy carries (an error's text is cut to this).
MAX_FAILURE_REASON_CHARS = 1024


@dataclass(frozen=True, slots=True)
class MessageLimits:
    """The limits of every stage for bodies of at most ``body_bytes``."""

    body_bytes: int

    def __post_init__(self) -> None:
        if self.body_bytes < 1:
            raise ValueError("the largest message body must be at least 1 byte")

    @property
    def record_bytes(self) -> int:
        """The largest record any stage writes: the body plus the header allowance."""
        return self.body_bytes + HEADER_ALLOWANCE_BYTES

    @property
    def topic_bytes(self) -> int:
        """``max.message.bytes`` of every topic Setu creates (ingest, main, tiers, DLQ): the
        largest record, or a full batch of small ones."""
        return max(self.record_bytes, MAX_BATCH_BYTES)

    @property
    def request_bytes(self) -> int:
        """The producers' request limit: librdkafka's ``message.max.bytes`` (API, delivery)
        and the Java client's ``max.request.size`` (the ingest job's Kafka sink)."""
        return self.topic_bytes + REQUEST_OVERHEAD_BYTES

    @property
    def fetch_bytes(self) -> int:
        """What a consumer asks for per partition and fetch, so one fetch holds any record."""
        return self.topic_bytes
