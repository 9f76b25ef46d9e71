"""Copies of main-log records that a replayed ingest batch wrote a second time.

The ingest job commits a micro-batch only after its Kafka write returned; a crash in between
(or a failed step after the write, such as Redis being down for the producer marks) makes the
next run write the batch again: the main log then holds the same records twice, the second
run right after the first, in the same order. Their main offsets differ, so recorded outcomes
(keyed by tier and offset) do not catch them, yet docs/design.md §3 forbids a second webhook
call for a message already delivered.

Every main record carries the ingest partition and offset it came from, and within one main
partition the records of one ingest partition arrive in increasing ingest offset, except in
such a replay. So a main record whose ingest offset is not above the highest already read
for its ingest partition is a replay copy: its original was read before it, and is finished or
in progress here.

The marks must outlive the worker: a replay can follow its original across a commit. The
committed main offset therefore carries, as its commit metadata (stored atomically with it),
the highest ingest offset per ingest partition among the records *below* it, all of which are
finished; a successor starts from those marks. A mark never covers a record above the commit,
so nothing unfinished is ever taken for a copy.

A main partition may be fed by its topic's own ingest topic and by the shared ingest log
(decision 0010: records produced before and after a switch of ``SETU_INGEST_LOG``), whose
partitions and offsets have nothing to do with each other. A shared-log partition ``p`` is
therefore marked as ``-(p + 1)`` (:func:`source_of`), which keeps the commit metadata's form.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping


def source_of(partition: int | None, log: str | None) -> int | None:
    """The mark key of an ingest partition: ``partition`` of a topic's own ingest topic,
    ``-(partition + 1)`` of the shared ingest log (``log`` set)."""
    if partition is None or log is None:
        return partition
    return -(partition + 1)


class IngestMarks:
    """Highest ingest offset read per ingest partition, for one main partition."""

    def __init__(self, committed: Mapping[int, int] | None = None) -> None:
        self._committed = dict(committed or {})
        self._seen = dict(self._committed)
        # (main offset, ingest partition, ingest offset) of records read above the commit.
        self._pending: deque[tuple[int, int, int]] = deque()
        self._last_offset = -1

    def admit(self, offset: int, ingest_partition: int | None, ingest_offset: int | None) -> bool:
        """False when the main record at ``offset`` is a replay copy. Records come in offset
        order; one read again (same or lower offset) is not judged here."""
        if ingest_partition is None or ingest_offset is None or offset <= self._last_offset:
            return True
        self._last_offset = offset
        if ingest_offset <= self._seen.get(ingest_partition, -1):
            return False
        self._seen[ingest_partition] = ingest_offset
        self._pending.append((offset, ingest_partition, ingest_offset))
        return True

    def below(self, offset: int) -> dict[int, int]:
        """The marks of every record below main offset ``offset``: what a commit of ``offset``
        stores (the caller commits only offsets whose records are all finished)."""
        pending = self._pending
        while pending and pending[0][0] < offset:
            _, partition, ingest_offset = pending.popleft()
            if ingest_offset > self._committed.get(partition, -1):
                self._committed[partition] = ingest_offset
        return dict(self._committed)


def encode_marks(marks: Mapping[int, int]) -> str:
    """``{0: 41, 3: 7}`` → ``"0:41,3:7"`` (Kafka commit metadata)."""
    return ",".join(f"{p}:{o}" for p, o in sorted(marks.items()))


def decode_marks(text: str | None) -> dict[int, int]:
    """The marks in commit metadata; none when it is empty or not ours."""
    marks: dict[int, int] = {}
    for item in (text or "").split(","):
        partition, sep, offset = item.partition(":")
        if not sep:
            continue
        try:
            marks[int(partition)] = int(offset)
        except ValueError:
            return {}
    return marks
