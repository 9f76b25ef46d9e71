"""One ingest partition's batch de-duplicated chunk by chunk, as its rows arrive.

The ingest job may not hold a partition's whole batch at once (a burst of large messages
would not fit in memory, docs/ingest.md "Memory per batch"), so it decides each Arrow chunk
as it comes and hands the kept rows on at once. What it keeps between chunks is small: per
producer of the partition, the highest sequence seen and the highest kept in the batch so far,
and the stored marks, read once at the partition's first message with a producer id.

The rule is :func:`spark.dedup.decide_incarnated`'s. Each row is judged as that function
judges it on the batch's rows up to and including it: against every earlier sequence of the
batch, and against the stored marks still live at the newest record time so far and of the
newest incarnation so far. So the decisions do not depend on how the rows are cut into
chunks, and a replayed batch decides as its first run did. They are those of the whole batch
at once unless a stored mark of the partition expires (TTL) or is superseded (a newer
incarnation of its topic) between the partition's first message and its last in the batch:
the whole-batch decision dropped such a mark before the batch's first row, which takes the
batch's last row to know. The marks stored at the end and their incarnations are the
whole-batch ones in every case.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from itertools import pairwise

import numpy as np
import numpy.typing as npt
import pandas as pd

from spark.dedup import (
    INCARNATION,
    NO_SEQUENCE,
    OFFSET,
    PARTITION,
    PRODUCER,
    SEQUENCE,
    TOPIC,
    ProducerKey,
    ProducerMark,
    copy_mark,
    current_marks,
    decide_frame,
    least_recently_seen,
    live_marks,
)

NO_TIME = -(1 << 62)
NO_INCARNATION = -1
"""Before the partition's first message with a producer id (stamped incarnations are >= 0)."""
StoredMarks = Mapping[ProducerKey, ProducerMark]


class PartitionStream:
    """The de-duplication of one (ingest topic, partition) in one batch, fed its rows chunk by
    chunk in log order (:meth:`decide`); then :meth:`marks` to store and :meth:`highs` to
    publish. ``load`` reads the partition's stored marks; it is called at most once, at the
    first row with a producer id, and not at all for a batch without one."""

    def __init__(
        self, topic: str, partition: int, ttl_ms: int, load: Callable[[], StoredMarks]
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.ttl_ms = ttl_ms
        self._load = load
        self.stored: StoredMarks | None = None
        self.now_ms = NO_TIME
        """The newest record time of the partition's rows so far."""
        self.incarnation = NO_INCARNATION
        """The newest incarnation the partition's rows with a producer id carried so far."""
        self.seen: dict[ProducerKey, int] = {}
        """Per producer: the highest sequence of its rows so far, kept or not."""
        self.kept: dict[ProducerKey, int] = {}
        """Per producer: the highest sequence kept so far."""
        self._expiries: npt.NDArray[np.int64] = np.empty(0, dtype=np.int64)

    @property
    def loaded(self) -> bool:
        """True once the stored marks were read: the partition's marks are then stored."""
        return self.stored is not None

    def decide(self, rows: pd.DataFrame, record_ms: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
        """Per row of ``rows`` (the partition's next rows, in offset order; ``record_ms`` their
        record times): keep it (True) or drop it as a duplicate."""
        keep = np.ones(len(rows), dtype=np.bool_)
        if len(rows) == 0:
            return keep
        now = np.maximum.accumulate(np.maximum(record_ms.astype(np.int64), self.now_ms))
        self.now_ms = int(now[-1])
        with_producer = np.flatnonzero(rows[PRODUCER].notna().to_numpy())
        if len(with_producer) == 0:
            return keep
        if self.stored is None:
            self.stored = dict(self._load())
            self._expiries = np.sort(
                np.array([m.last_seen_ms + self.ttl_ms for m in self.stored.values()], np.int64)
            )
        incarnations = rows[INCARNATION].to_numpy(dtype=np.int64)[with_producer]
        incarnation = np.maximum.accumulate(np.maximum(incarnations, self.incarnation))
        self.incarnation = int(incarnation[-1])
        # The stored marks that judge a row change only where a mark expires or a newer
        # incarnation arrives: rows between two such points are decided together.
        expired = np.searchsorted(self._expiries, now[with_producer], side="right")
        changes = (expired[1:] != expired[:-1]) | (incarnation[1:] != incarnation[:-1])
        bounds = [0, *(np.flatnonzero(changes) + 1).tolist(), len(with_producer)]
        for start, end in pairwise(bounds):
            at = with_producer[start:end]
            keep[at] = self._decide_run(rows.iloc[at], int(now[at[0]]), int(incarnation[start]))
        return keep

    def _decide_run(
        self, rows: pd.DataFrame, now_ms: int, incarnation: int
    ) -> npt.NDArray[np.bool_]:
        assert self.stored is not None
        judging, _ = current_marks(
            live_marks(self.stored, now_ms, self.ttl_ms), {self.topic: incarnation}
        )
        producers = [(self.topic, str(p)) for p in pd.unique(rows[PRODUCER].to_numpy())]
        # The batch's earlier rows count as a stored mark would: a row must pass both.
        known = {
            owner: ProducerMark(
                {
                    self.partition: max(
                        self._stored_high(judging, owner), self.seen.get(owner, NO_SEQUENCE)
                    )
                }
            )
            for owner in producers
        }
        keep = decide_frame(rows, known, now_ms).keep
        sequences = rows[SEQUENCE].to_numpy(dtype=np.int64)
        owners = rows[PRODUCER].to_numpy()
        self._raise(self.seen, owners, sequences)
        self._raise(self.kept, owners[keep], sequences[keep])
        return keep

    def _raise(
        self,
        highs: dict[ProducerKey, int],
        owners: npt.NDArray[np.object_],
        sequences: npt.NDArray[np.int64],
    ) -> None:
        if len(owners) == 0:
            return
        for producer, high in pd.Series(sequences).groupby(owners, sort=False).max().items():
            owner = (self.topic, str(producer))
            highs[owner] = max(highs.get(owner, NO_SEQUENCE), int(high))

    def _stored_high(self, marks: StoredMarks, owner: ProducerKey) -> int:
        mark = marks.get(owner)
        return NO_SEQUENCE if mark is None else mark.partitions.get(self.partition, NO_SEQUENCE)

    def _current(self) -> tuple[StoredMarks, StoredMarks, int]:
        """The stored marks live at the batch's end, those of them that still judge, and the
        topic's current incarnation (as :func:`spark.dedup.decide_incarnated` has them)."""
        live = live_marks(self.stored or {}, self.now_ms, self.ttl_ms)
        judging, current = current_marks(live, {self.topic: self.incarnation})
        return live, judging, current[self.topic]

    def marks(self, cap: int) -> dict[ProducerKey, ProducerMark]:
        """The partition's marks after the batch, at most ``cap`` of them (the least recently
        seen forgotten)."""
        live, judging, incarnation = self._current()
        out = {o: m for o, m in live.items() if o in judging}
        for owner, high in self.seen.items():
            mark = copy_mark(judging.get(owner))
            mark.last_seen_ms = max(mark.last_seen_ms, self.now_ms)
            if high > self._stored_high(judging, owner):
                mark.partitions[self.partition] = high
            mark.incarnation = incarnation
            out[owner] = mark
        for owner in least_recently_seen(out, cap):
            del out[owner]
        return out

    def highs(self) -> dict[ProducerKey, tuple[int, int]]:
        """Per producer with a kept row: (the topic's current incarnation, its highest kept
        sequence), as the producer marks in Redis are raised (:mod:`spark.marks`)."""
        _, _, incarnation = self._current()
        return {owner: (incarnation, high) for owner, high in self.kept.items()}


class RecordRule:
    """The rule of :class:`PartitionStream` with every record judged as a batch of its own, and
    a partition clock that never goes back: the reference for the ingest job's JVM operator
    (``spark/jvm/src/main/java/setu/ingest/PartitionRule.java``), which
    ``tests/unit/spark/test_jvm_rule.py`` holds to the same decisions on random histories.

    Records without a producer id are judged by message id within their topic's window: a copy
    kept less than ``window_ms`` of partition clock ago, under the same or a newer incarnation,
    is a duplicate. At most ``max_ids`` ids are kept; beyond that those whose window ends first
    (then the smaller id) are forgotten."""

    def __init__(
        self, topic: str, partition: int, ttl_ms: int, max_marks: int, max_ids: int
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.ttl_ms = ttl_ms
        self.max_marks = max_marks
        self.max_ids = max_ids
        self.clock_ms = NO_TIME
        self.marks: dict[ProducerKey, ProducerMark] = {}
        self.ids: dict[str, tuple[int, int]] = {}
        """Message id -> (clock at which its window ends, incarnation)."""

    def admit(
        self,
        producer: str | None,
        sequence: int,
        incarnation: int,
        record_ms: int,
        message_id: str | None,
        window_ms: int,
    ) -> bool:
        """True if the record is new (then it is remembered); records in offset order."""
        self.clock_ms = max(self.clock_ms, record_ms)
        if producer is None:
            return self._admit_id(message_id, incarnation, window_ms)
        stream = PartitionStream(self.topic, self.partition, self.ttl_ms, lambda: self.marks)
        stream.now_ms = self.clock_ms
        row = pd.DataFrame(
            {
                TOPIC: [self.topic],
                PRODUCER: [producer],
                PARTITION: [self.partition],
                OFFSET: [0],
                SEQUENCE: [sequence],
                INCARNATION: [incarnation],
            }
        )
        keep = bool(stream.decide(row, np.array([record_ms], dtype=np.int64))[0])
        self.marks = stream.marks(self.max_marks)
        return keep

    def _admit_id(self, message_id: str | None, incarnation: int, window_ms: int) -> bool:
        if window_ms <= 0 or message_id is None:
            return True
        seen = self.ids.get(message_id)
        if seen is not None and seen[0] > self.clock_ms and seen[1] >= incarnation:
            return False
        self.ids[message_id] = (self.clock_ms + window_ms, incarnation)
        live = {i: s for i, s in self.ids.items() if s[0] > self.clock_ms}
        for forgotten in sorted(live, key=lambda i: (live[i][0], i))[
            : max(0, len(live) - self.max_ids)
        ]:
            del live[forgotten]
        self.ids = live
        return True

    def judging(self) -> dict[ProducerKey, ProducerMark]:
        """The marks that judge at the partition clock."""
        return live_marks(self.marks, self.clock_ms, self.ttl_ms)
