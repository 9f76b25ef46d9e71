"""De-duplication by producer sequence (docs/design.md §3), as pure functions over plain data.

Pulsar's PIP-6, per ingest partition: per (topic, producer id, ingest partition) the job keeps
the highest sequence accepted, and a message whose sequence is not greater is a duplicate.

Why per partition. The API keys every record by GroupId, else MessageId, so a retried message
(same ids) always lands on the partition of its first copy and is always caught. Across
partitions neither Kafka nor a micro-batch orders one producer's messages: a producer that
pipelines (the batch produce API) has seq 6 and 7 in flight to two partitions at once, and
``maxOffsetsPerTrigger`` reads further into one partition than another, so seq 7 may be read
first; a producer-wide rule would then drop seq 6 and lose it. Within a partition the log order
is the produce order, so the rule is exact there. The producer's highest sequence over all
partitions (what ``GET .../producers/{id}`` answers) is the max of its partition marks. An older
sequence under a *new* message id is dropped when the producer already went past it in that
message's partition, and passes otherwise.

A topic deleted and created again under the same name starts with no marks: every message
with a producer id carries its topic's *incarnation* (the topic's creation time, stamped by the
API), each mark remembers the incarnation it was built under, and the first message of a newer
incarnation of a topic drops that topic's older marks before anything is judged. A message
stamped with an older incarnation than its topic's marks (an API replica whose topic cache had
not yet seen the new topic) is judged as one of the current incarnation. docs/ingest.md, "A
topic created again", says why and what remains.

The decisions depend only on the marks and the rows, so a replayed batch decides exactly as
before. :func:`decide_batch` states the rule one message at a time; :func:`decide_frame` is the
same rule over a whole frame in a few vectorised passes (what the job runs), and
:func:`encode_marks` / :func:`decode_marks` are the state store form of a bucket's marks.
"""

from __future__ import annotations

import json
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, NamedTuple, TypeVar

import numpy as np
import numpy.typing as npt
import pandas as pd

SHARES = 32
"""Each ingest partition keeps at most ``ceil(max / SHARES)`` producer marks (and message ids)
of a ``SETU_DEDUP_MAX_PRODUCERS`` (``SETU_DEDUP_MAX_MESSAGE_IDS``) of ``max``: a producer writing
to k partitions counts k times."""


def partition_cap(maximum: int) -> int:
    """Marks (or message ids) one ingest partition keeps of ``maximum``."""
    return max(1, -(-maximum // SHARES))


NO_SEQUENCE = -1
K = TypeVar("K", bound=Hashable)
"""A producer's identity; the job uses (ingest topic, producer id)."""
ProducerKey = tuple[str, str]
"""(ingest topic, producer id): whom a mark belongs to."""

# The columns of the frame :func:`decide_frame` reads.
TOPIC, PRODUCER, PARTITION, OFFSET, SEQUENCE = "topic", "producer", "partition", "offset", "seq"
INCARNATION = "incarnation"


@dataclass(slots=True)
class ProducerMark:
    """What the job remembers about one producer of one topic."""

    partitions: dict[int, int] = field(default_factory=dict)
    """Ingest partition -> highest sequence accepted there."""
    last_seen_ms: int = 0
    """Batch time at which the producer last sent a message (for least-recently-seen eviction)."""
    incarnation: int = 0
    """The topic incarnation the mark was built under (0: before incarnations were stamped)."""

    @property
    def high(self) -> int:
        """Highest sequence accepted from the producer in any partition."""
        return max(self.partitions.values(), default=NO_SEQUENCE)


class Incoming(NamedTuple):
    """The fields of one ingest record that the decision reads (a tuple: cheap to build)."""

    partition: int
    offset: int
    sequence: int


def admit(mark: ProducerMark, message: Incoming) -> bool:
    """True if ``message`` is new; then ``mark`` is advanced past it (in place).

    Messages of one partition must be offered in offset order.
    """
    if message.sequence <= mark.partitions.get(message.partition, NO_SEQUENCE):
        return False
    mark.partitions[message.partition] = message.sequence
    return True


@dataclass(frozen=True, slots=True)
class BatchDecision(Generic[K]):
    """The outcome of one batch for a set of producers."""

    accepted: list[bool]
    """Per input row: keep it (True) or drop it as a duplicate."""
    highs: dict[K, int]
    """Per producer with an accepted row: its highest accepted sequence in the batch."""
    marks: dict[K, ProducerMark]
    """The updated mark of every producer that sent something in the batch."""


def decide_batch(
    producers: Sequence[K | None],
    messages: Sequence[Incoming],
    known: Mapping[K, ProducerMark],
    now_ms: int,
) -> BatchDecision[K]:
    """Decide every row; row i came from ``producers[i]`` (None: no producer id, always kept).

    Rows are visited in (partition, offset) order whatever their order here. ``known`` is not
    modified.
    """
    accepted = [True] * len(messages)
    highs: dict[K, int] = {}
    marks: dict[K, ProducerMark] = {}
    for i in sorted(
        range(len(messages)), key=lambda i: (messages[i].partition, messages[i].offset)
    ):
        producer = producers[i]
        if producer is None:
            continue
        mark = marks.get(producer)
        if mark is None:
            mark = marks[producer] = copy_mark(known.get(producer))
            mark.last_seen_ms = max(mark.last_seen_ms, now_ms)
        accepted[i] = admit(mark, messages[i])
        if accepted[i] and messages[i].sequence > highs.get(producer, NO_SEQUENCE):
            highs[producer] = messages[i].sequence
    return BatchDecision(accepted, highs, marks)


def copy_mark(mark: ProducerMark | None) -> ProducerMark:
    if mark is None:
        return ProducerMark()
    return ProducerMark(dict(mark.partitions), mark.last_seen_ms, mark.incarnation)


def current_marks(
    known: Mapping[ProducerKey, ProducerMark], incarnations: Mapping[str, int]
) -> tuple[dict[ProducerKey, ProducerMark], dict[str, int]]:
    """The marks that still judge, given the highest incarnation of each topic in a batch.

    Per topic the current incarnation is the highest of the batch's and the marks'; a mark
    built under an older one belongs to a deleted life of the topic and is dropped. Returns
    the marks kept and each batch topic's current incarnation."""
    current = dict(incarnations)
    for (topic, _), mark in known.items():
        if topic in current and mark.incarnation > current[topic]:
            current[topic] = mark.incarnation
    kept = {
        owner: mark
        for owner, mark in known.items()
        if owner[0] not in current or mark.incarnation >= current[owner[0]]
    }
    return kept, current


def least_recently_seen(marks: Mapping[K, ProducerMark], keep: int) -> list[K]:
    """The producers to forget so that at most ``keep`` remain: those seen longest ago (of
    those seen at the same time, the smaller first)."""
    if len(marks) <= keep:
        return []
    oldest_first = sorted(marks, key=lambda p: (marks[p].last_seen_ms, p))
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


@dataclass(frozen=True, slots=True)
class FrameDecision:
    """The outcome of one batch, as :class:`BatchDecision` but positional over a frame."""

    keep: npt.NDArray[np.bool_]
    """Per row of the frame, by position: keep it (True) or drop it as a duplicate."""
    highs: dict[ProducerKey, int]
    marks: dict[ProducerKey, ProducerMark]
    dropped: frozenset[ProducerKey] = frozenset()
    """Stored marks of an older incarnation of their topic, to forget (:func:`current_marks`)."""


def decide_frame(
    frame: pd.DataFrame, known: Mapping[ProducerKey, ProducerMark], now_ms: int
) -> FrameDecision:
    """:func:`decide_batch` for the rows of ``frame``, producer = (topic, producer column).

    ``frame`` has the columns ``TOPIC``, ``PRODUCER`` (null: no producer, always kept),
    ``PARTITION``, ``OFFSET`` and ``SEQUENCE`` (int64; any value where the producer is null),
    rows in any order. Same decisions, highs and marks as :func:`decide_batch`; ``known`` is not
    modified.
    """
    keep = np.ones(len(frame), dtype=np.bool_)
    rows = np.flatnonzero(frame[PRODUCER].notna().to_numpy())
    if len(rows) == 0:
        return FrameDecision(keep, {}, {})
    topic, topics = pd.factorize(frame[TOPIC].to_numpy()[rows])
    producer, producers = pd.factorize(frame[PRODUCER].to_numpy()[rows])
    partition = frame[PARTITION].to_numpy(dtype=np.int64)[rows]
    offset = frame[OFFSET].to_numpy(dtype=np.int64)[rows]
    sequence = frame[SEQUENCE].to_numpy(dtype=np.int64)[rows]
    # One run of rows per (topic, producer, partition), each run in offset order.
    order = np.lexsort((offset, partition, producer, topic))
    topic, producer, partition, sequence = (
        topic[order],
        producer[order],
        partition[order],
        sequence[order],
    )
    changed = (topic[1:] != topic[:-1]) | (producer[1:] != producer[:-1])
    starts = np.flatnonzero(np.r_[True, changed | (partition[1:] != partition[:-1])])
    run = np.repeat(np.arange(len(starts)), np.diff(np.r_[starts, len(sequence)]))
    owners: list[ProducerKey] = [(topics[topic[i]], producers[producer[i]]) for i in starts]
    base = np.array(
        [
            _partition_mark(known.get(o), int(partition[i]))
            for o, i in zip(owners, starts, strict=True)
        ],
        dtype=np.int64,
    )
    # A row is judged against the mark left by the rows before it: the highest of the stored
    # mark and every earlier sequence of its run (the mark only ever moves to a kept sequence).
    running = pd.Series(sequence).groupby(run).cummax().to_numpy(dtype=np.int64)
    before = np.r_[NO_SEQUENCE, running[:-1]]
    before[starts] = NO_SEQUENCE
    kept = sequence > np.maximum(before, base[run])
    keep[rows[order]] = kept
    run_high = np.maximum.reduceat(sequence, starts)
    run_kept_high = np.maximum.reduceat(np.where(kept, sequence, NO_SEQUENCE), starts)
    highs: dict[ProducerKey, int] = {}
    marks: dict[ProducerKey, ProducerMark] = {}
    for n, owner in enumerate(owners):
        mark = marks.get(owner)
        if mark is None:
            mark = marks[owner] = copy_mark(known.get(owner))
            mark.last_seen_ms = max(mark.last_seen_ms, now_ms)
        if run_high[n] > base[n]:
            mark.partitions[int(partition[starts[n]])] = int(run_high[n])
        if run_kept_high[n] > highs.get(owner, NO_SEQUENCE):
            highs[owner] = int(run_kept_high[n])
    return FrameDecision(keep, highs, marks)


def frame_incarnations(frame: pd.DataFrame) -> dict[str, int]:
    """Per topic with a producer's row in ``frame``: the highest incarnation its rows carry
    (column ``INCARNATION``; 0 for rows stamped before incarnations existed)."""
    with_producer = frame[frame[PRODUCER].notna()]
    if with_producer.empty:
        return {}
    highest = with_producer.groupby(TOPIC, sort=False)[INCARNATION].max()
    return {str(topic): int(incarnation) for topic, incarnation in highest.items()}


def decide_incarnated(
    frame: pd.DataFrame, known: Mapping[ProducerKey, ProducerMark], now_ms: int
) -> tuple[FrameDecision, dict[ProducerKey, tuple[int, int]]]:
    """:func:`decide_frame` after dropping the marks of older topic incarnations
    (:func:`current_marks`). The decision's marks carry their topic's current incarnation;
    the second value is each producer's batch high as (incarnation, sequence), as the
    producer marks in Redis are raised (:mod:`spark.marks`)."""
    kept, current = current_marks(known, frame_incarnations(frame))
    decision = decide_frame(frame, kept, now_ms)
    for (topic, _), mark in decision.marks.items():
        mark.incarnation = current[topic]
    highs = {owner: (current[owner[0]], high) for owner, high in decision.highs.items()}
    dropped = frozenset(known.keys() - kept.keys())
    return FrameDecision(decision.keep, decision.highs, decision.marks, dropped), highs


def _partition_mark(mark: ProducerMark | None, partition: int) -> int:
    return NO_SEQUENCE if mark is None else mark.partitions.get(partition, NO_SEQUENCE)


def live_marks(marks: Mapping[K, ProducerMark], now_ms: int, ttl_ms: int) -> dict[K, ProducerMark]:
    """The marks not idle for ``ttl_ms`` or more at ``now_ms`` (batch time)."""
    return {p: m for p, m in marks.items() if m.last_seen_ms + ttl_ms > now_ms}


def encode_marks(marks: Mapping[ProducerKey, ProducerMark]) -> str:
    """One bucket's marks as one state store value (JSON)."""
    return json.dumps(
        [
            [t, p, m.last_seen_ms, sorted(m.partitions.items()), m.incarnation]
            for (t, p), m in marks.items()
        ],
        separators=(",", ":"),
    )


def decode_marks(text: str) -> dict[ProducerKey, ProducerMark]:
    """Inverse of :func:`encode_marks`; a mark stored before incarnations has incarnation 0."""
    out: dict[ProducerKey, ProducerMark] = {}
    item: list[Any]
    for item in json.loads(text):
        topic, producer, last_seen_ms, partitions = item[:4]
        incarnation = item[4] if len(item) > 4 else 0
        out[(topic, producer)] = ProducerMark(
            dict(map(tuple, partitions)), last_seen_ms, incarnation
        )
    return out
