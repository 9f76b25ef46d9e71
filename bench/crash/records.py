"""The crash test's records: a pure function of (run, lane, sequence).

Every record is small and unique, and its group and body are derived from its identity alone, so
a restarted producer re-sends exactly the bytes it sent before, and the receiver's payload hash
can be compared with the producer's. A *lane* is one producer id sending one record at a time;
each group belongs to exactly one lane, so a group's publish order is its lane's sequence order.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Record:
    """One message as the producer publishes it."""

    message_id: str
    group_id: str
    producer_id: str
    sequence_id: int
    body: bytes
    extra_headers: int = 0  # how many X_TAG_n headers of 100 characters it is sent with
    # Sent with X_DELIVER_AFTER_MS (docs/scheduling.md): its group waits behind it (0: not).
    deliver_after_ms: int = 0

    @property
    def payload_hash(self) -> str:
        return payload_hash(self.body)


def payload_hash(body: bytes) -> str:
    """The hash both witnesses log for a body: SHA-256, hex."""
    return hashlib.sha256(body).hexdigest()


def group_name(index: int) -> str:
    return f"g{index:05d}"


def producer_name(run_id: str, lane: int) -> str:
    return f"{run_id}-p{lane:03d}"


def lane_groups(groups: int, lanes: int, lane: int) -> list[str]:
    """The groups owned by ``lane``: every ``lanes``-th group, starting at ``lane``."""
    if not 0 <= lane < lanes <= groups:
        raise ValueError(f"need 0 <= lane < lanes <= groups, got {lane=} {lanes=} {groups=}")
    return [group_name(index) for index in range(lane, groups, lanes)]


def is_stream_lane(lane: int, lanes: int, stream_lanes: int) -> bool:
    """The last ``stream_lanes`` lanes stream (docs/streaming.md); the others use HTTP."""
    return lane >= lanes - stream_lanes


def _digest(run_id: str, lane: int, sequence: int) -> bytes:
    return hashlib.sha256(f"{run_id}/{lane}/{sequence}".encode()).digest()


# One record in SHAPE_EVERY is large (its body exactly the size limit, or one byte under), one
# carries many headers; the rest are small.
SHAPE_EVERY = 256
MANY_HEADERS = 40
# One record of an HTTP lane in SCHEDULE_EVERY asks to be delivered 0.5 to 5.6 s after its
# produce, holding its group back meanwhile (docs/scheduling.md).
SCHEDULE_EVERY = 24


def make_record(
    run_id: str,
    groups: int,
    lanes: int,
    lane: int,
    sequence: int,
    large_body_bytes: int = 0,
    *,
    stream: bool = False,
) -> Record:
    """The record ``lane`` publishes at ``sequence``; the same arguments give the same bytes.

    The body is the identity in text followed by 16 pseudo-random bytes (any value 0..255), so a
    body that was truncated, re-encoded or swapped with another message's shows as corrupt.
    With ``large_body_bytes`` (the API's size limit), a few bodies are padded to exactly that
    size or one byte under it, and a few records carry :data:`MANY_HEADERS` extra headers: every
    stage must carry whatever the API accepts.
    """
    owned = lane_groups(groups, lanes, lane)
    digest = _digest(run_id, lane, sequence)
    group = owned[int.from_bytes(digest[:4], "big") % len(owned)]
    producer = producer_name(run_id, lane)
    # A streamed message's id is made by Setu: {producer_id}:{sequence_id}.
    message_id = f"{producer}:{sequence}" if stream else f"{producer}-{sequence}"
    body = f"{message_id}|{group}|".encode() + digest[4:20]
    shape, extra = digest[20] % SHAPE_EVERY, 0
    if large_body_bytes and shape in (0, 1):
        size = large_body_bytes - shape
        body += (digest * (size // len(digest) + 1))[: size - len(body)]
    elif large_body_bytes and shape == 2 and not stream:  # X_* headers do not travel on streams
        extra = MANY_HEADERS
    later = 0
    if not stream and digest[21] % SCHEDULE_EVERY == 0:
        later = 500 + digest[22] * 20
    return Record(message_id, group, producer, sequence, body, extra, later)
