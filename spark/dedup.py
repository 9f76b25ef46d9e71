"""De-duplication by producer sequence (DESIGN §3), as pure functions over plain data.

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

The decisions depend only on the marks and the rows, so a replayed batch decides exactly as
before.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, NamedTuple, TypeVar

NO_SEQUENCE = -1
K = TypeVar("K", bound=Hashable)
"""A producer's identity; the job uses (ingest topic, producer id)."""


@dataclass(slots=True)
class ProducerMark:
    """What the job remembers about one producer of one topic."""

    partitions: dict[int, int] = field(default_factory=dict)
    """Ingest partition -> highest sequence accepted there."""
    last_seen_ms: int = 0
    """Batch time at which the producer last sent a message (for least-recently-seen eviction)."""

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
    return ProducerMark(dict(mark.partitions), mark.last_seen_ms)


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
