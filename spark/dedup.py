"""De-duplication by producer sequence (DESIGN §3), as pure functions over plain data.

Per (ingest topic, producer id) the job keeps a :class:`ProducerMark`. A message is a duplicate
when its sequence is not greater than the highest sequence accepted for its producer (Pulsar's
PIP-6). "Accepted before" is judged in produce order, not in the order Spark happens to read:

* Within one ingest partition the log order is the produce order, so a message whose sequence
  is not above the highest accepted in its own partition is always a duplicate. A retried
  message has the same key as the original, hence the same partition, so every retry is caught
  here, however late it is read.
* Across partitions neither the log nor a micro-batch orders a producer's messages: a producer
  that pipelines (the batch produce API) has seq 6 and 7 in flight to two partitions at once, and
  ``maxOffsetsPerTrigger`` reads more of one partition than of another, so seq 7 may be read
  first. Dropping seq 6 then would lose a message. So a message is judged against the producer's
  overall highest sequence only if it was produced (record timestamp) more than
  :data:`REORDER_WINDOW_MS` after the newest accepted message: then it is a stale resend of an
  old sequence. Inside the window it is judged by its partition alone.

Within a batch the messages of one producer are visited in :func:`merge_order`: offset order
inside each partition, partitions interleaved by produce time. The decisions depend only on the
marks and the rows, so a replayed batch decides exactly as before.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

NO_SEQUENCE = -1
REORDER_WINDOW_MS = 10_000
"""How far apart in time one producer's messages may reach different partitions out of order."""
K = TypeVar("K", bound=Hashable)
"""A producer's identity; the job uses (ingest topic, producer id)."""


@dataclass(slots=True)
class ProducerMark:
    """What the job remembers about one producer of one topic."""

    high: int = NO_SEQUENCE
    """Highest sequence accepted from the producer, in any partition."""
    high_ts: int = -1
    """Newest produce timestamp (ms) among the producer's accepted messages."""
    partitions: dict[int, int] = field(default_factory=dict)
    """Ingest partition -> highest sequence accepted there."""
    last_seen_ms: int = 0
    """Batch time at which the producer last sent a message (for least-recently-seen eviction)."""


@dataclass(frozen=True, slots=True)
class Incoming:
    """The fields of one ingest record that the decision reads."""

    partition: int
    offset: int
    timestamp_ms: int
    sequence: int


def admit(mark: ProducerMark, message: Incoming) -> bool:
    """True if ``message`` is new; then ``mark`` is advanced past it (in place)."""
    if message.sequence <= mark.partitions.get(message.partition, NO_SEQUENCE):
        return False
    produced_well_after_newest = message.timestamp_ms > mark.high_ts + REORDER_WINDOW_MS
    if produced_well_after_newest and message.sequence <= mark.high:
        return False
    mark.partitions[message.partition] = message.sequence
    mark.high = max(mark.high, message.sequence)
    mark.high_ts = max(mark.high_ts, message.timestamp_ms)
    return True


def merge_order(messages: Sequence[Incoming]) -> list[int]:
    """Indexes of ``messages`` (one producer) in the order :func:`admit` must see them.

    Offsets stay in order within a partition even if a timestamp goes backwards there (two API
    hosts with skewed clocks): each message sorts by the newest timestamp seen so far in its
    partition.
    """
    by_log = sorted(range(len(messages)), key=lambda i: (messages[i].partition, messages[i].offset))
    effective: dict[int, int] = {}
    newest: dict[int, int] = {}
    for i in by_log:
        m = messages[i]
        newest[m.partition] = max(newest.get(m.partition, m.timestamp_ms), m.timestamp_ms)
        effective[i] = newest[m.partition]
    return sorted(by_log, key=lambda i: (effective[i], messages[i].partition, messages[i].offset))


@dataclass(frozen=True, slots=True)
class BatchDecision(Generic[K]):
    """The outcome of one batch for a set of producers."""

    accepted: list[bool]
    """Per input row: keep it (True) or drop it as a duplicate."""
    high_rows: list[int]
    """Per producer with an accepted row: the index of its highest accepted sequence."""
    marks: dict[K, ProducerMark]
    """The updated mark of every producer that sent something in the batch."""


def decide_batch(
    producers: Sequence[K],
    messages: Sequence[Incoming],
    known: Mapping[K, ProducerMark],
    now_ms: int,
) -> BatchDecision[K]:
    """Decide every row of a batch; row i came from ``producers[i]``. ``known`` is not modified."""
    rows_of: dict[K, list[int]] = {}
    for i, producer in enumerate(producers):
        rows_of.setdefault(producer, []).append(i)
    accepted = [False] * len(messages)
    high_rows: list[int] = []
    marks: dict[K, ProducerMark] = {}
    for producer, rows in rows_of.items():
        mark = copy_mark(known.get(producer))
        mark.last_seen_ms = max(mark.last_seen_ms, now_ms)
        own = [messages[i] for i in rows]
        best = -1
        for j in merge_order(own):
            if admit(mark, own[j]):
                accepted[rows[j]] = True
                if best < 0 or own[j].sequence > messages[best].sequence:
                    best = rows[j]
        if best >= 0:
            high_rows.append(best)
        marks[producer] = mark
    return BatchDecision(accepted, sorted(high_rows), marks)


def copy_mark(mark: ProducerMark | None) -> ProducerMark:
    if mark is None:
        return ProducerMark()
    return ProducerMark(mark.high, mark.high_ts, dict(mark.partitions), mark.last_seen_ms)


def least_recently_seen(marks: Mapping[K, ProducerMark], keep: int) -> list[K]:
    """The producers to forget so that at most ``keep`` remain: those seen longest ago."""
    if len(marks) <= keep:
        return []
    oldest_first = sorted(marks, key=lambda p: (marks[p].last_seen_ms, str(p)))
    return oldest_first[: len(marks) - keep]


def encode_partitions(partitions: Mapping[int, int]) -> str:
    """'0:12,3:40' — a compact form for the state store."""
    return ",".join(f"{p}:{s}" for p, s in sorted(partitions.items()))


def decode_partitions(text: str) -> dict[int, int]:
    out: dict[int, int] = {}
    for item in filter(None, text.split(",")):
        partition, sequence = item.split(":")
        out[int(partition)] = int(sequence)
    return out
