"""The de-duplication step of the ingest job (a ``mapInPandas`` function), with its marks in a
real folder as in a local checkpoint."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from spark.dedup import ProducerMark, decode_marks, encode_marks
from spark.dedup_state import KEEP_OLDER, PartitionMarks
from spark.processor import SHARES, PartitionDedup
from tests.unit.spark.accumulators import FakeCounts, FakeHighs, FakeWaits

COLUMNS = ["topic", "partition", "offset", "value", "producer", "seq", "incarnation", "record_ms"]
OUTPUT = ["topic", "partition", "offset", "value"]


@dataclass
class Dedup:
    marks: PartitionMarks
    ttl_ms: int = 60_000
    max_producers: int = 1000
    highs: FakeHighs = field(default_factory=FakeHighs)
    counts: FakeCounts = field(default_factory=FakeCounts)
    waits: FakeWaits = field(default_factory=FakeWaits)

    def run(
        self, batch: int, rows: list[tuple[Any, ...]], now_ms: int = 1000, started_ms: int = 0
    ) -> list[tuple[Any, ...]]:
        """Feeds ``rows`` as two Arrow-sized chunks, as Spark may (one where that would put a
        partition's rows out of offset order across chunks, which Spark never does); returns
        the emitted rows. A row without an incarnation has incarnation 0, without a record
        time ``now_ms``."""
        defaults = (0, now_ms)
        full = [row + defaults[len(row) - 6 :] for row in rows]
        frame = pd.DataFrame(full, columns=COLUMNS)
        halves = [frame.iloc[: len(rows) // 2], frame.iloc[len(rows) // 2 :]]
        chunks: Iterator[pd.DataFrame] = iter(halves if in_order(*halves) else [frame])
        function = PartitionDedup(
            batch,
            self.marks,
            self.ttl_ms,
            self.max_producers,
            OUTPUT,
            self.highs,  # type: ignore[arg-type]
            self.counts,  # type: ignore[arg-type]
            self.waits,  # type: ignore[arg-type]
            started_ms,
        )
        out = list(function(chunks))
        if not out:
            return []
        return list(pd.concat(out).itertuples(index=False, name=None))

    def stored(self, topic: str, partition: int, below: int = 1 << 62) -> dict[Any, ProducerMark]:
        loaded = self.marks.load(topic, partition, below)
        return decode_marks(loaded.text) if loaded.text else {}


def in_order(first: pd.DataFrame, second: pd.DataFrame) -> bool:
    """True if every partition's rows in ``second`` come after its rows in ``first``."""
    last = first.groupby(["topic", "partition"])["offset"].max()
    start = second.groupby(["topic", "partition"])["offset"].min()
    both = last.index.intersection(start.index)
    return bool((last[both] < start[both]).all())


@pytest.fixture
def dedup(tmp_path: Path) -> Dedup:
    return Dedup(PartitionMarks(str(tmp_path / "checkpoint")))


def store(dedup: Dedup, batch: int, marks: dict[Any, ProducerMark], partition: int = 0) -> None:
    dedup.marks.save("t", partition, batch, encode_marks(marks))


def test_a_partitions_rows_leave_deduplicated_in_log_order(dedup: Dedup) -> None:
    # Given a partition's rows out of order: a retry and an anonymous message among them
    rows = [
        ("t", 0, 1, b"a1", "p", 1),
        ("t", 0, 0, b"a0", "p", 0),
        ("t", 0, 2, b"a1 again", "p", 1),
        ("t", 0, 3, b"free", None, -1),
    ]
    # When batch 4 decides them
    out = dedup.run(4, rows)
    # Then the retry is gone, the rest come out by offset, and the marks are version 4
    assert out == [("t", 0, 0, b"a0"), ("t", 0, 1, b"a1"), ("t", 0, 3, b"free")]
    assert dedup.highs.value == {("t", "p"): (0, 1)}
    assert dedup.marks.versions("t", 0) == [4]
    assert dedup.stored("t", 0) == {("t", "p"): ProducerMark({0: 1}, 1000)}


def test_each_partition_of_a_task_keeps_its_own_marks(dedup: Dedup) -> None:
    out = dedup.run(1, [("t", 1, 0, b"b0", "p", 0), ("t", 0, 0, b"a0", "p", 3)])
    assert sorted(out) == [("t", 0, 0, b"a0"), ("t", 1, 0, b"b0")]
    assert dedup.stored("t", 0) == {("t", "p"): ProducerMark({0: 3}, 1000)}
    assert dedup.stored("t", 1) == {("t", "p"): ProducerMark({1: 0}, 1000)}


def test_next_batch_is_judged_against_the_stored_marks(dedup: Dedup) -> None:
    # Given marks of batch 3: producer p at sequence 5 on partition 0
    store(dedup, 3, {("t", "p"): ProducerMark({0: 5}, 1000)})
    # When batch 4 has p resend 5 and send 6
    out = dedup.run(4, [("t", 0, 7, b"old", "p", 5), ("t", 0, 8, b"new", "p", 6)])
    # Then only 6 passes
    assert out == [("t", 0, 8, b"new")]


def test_a_batch_run_again_decides_exactly_as_its_first_run(dedup: Dedup) -> None:
    # Given batch 7 ran (and stored its marks) but was never committed
    store(dedup, 6, {("t", "p"): ProducerMark({0: 5}, 1000)})
    rows = [("t", 0, 7, b"dup", "p", 5), ("t", 0, 8, b"new", "p", 6), ("t", 0, 9, b"n2", "p", 7)]
    first = dedup.run(7, rows)
    # When it runs again from the same offsets
    again = dedup.run(7, rows)
    # Then it starts from batch 6's marks, not its own, and keeps the very same rows
    assert first == again == [("t", 0, 8, b"new"), ("t", 0, 9, b"n2")]
    assert dedup.stored("t", 0) == {("t", "p"): ProducerMark({0: 7}, 1000)}


def test_only_a_few_versions_below_the_newest_are_kept(dedup: Dedup) -> None:
    for batch in range(1, 8):
        dedup.run(batch, [("t", 0, batch, b"x", "p", batch)])
    assert dedup.marks.versions("t", 0) == list(range(7 - KEEP_OLDER, 8))


def test_marks_idle_for_the_ttl_no_longer_judge(dedup: Dedup) -> None:
    # Given a mark last seen at record time 1000 and a 3 s TTL
    dedup.ttl_ms = 3000
    store(dedup, 1, {("t", "p"): ProducerMark({0: 5}, 1000)})
    # When an older sequence arrives in a record written once the TTL has passed
    out = dedup.run(2, [("t", 0, 9, b"late", "p", 2), ("t", 0, 10, b"x", None, -1)], now_ms=4000)
    # Then it is accepted, and the marks hold only the fresh one
    assert [r[3] for r in out] == [b"late", b"x"]
    assert dedup.stored("t", 0) == {("t", "p"): ProducerMark({0: 2}, 4000)}


def test_each_partition_forgets_its_least_recently_seen_beyond_its_share(dedup: Dedup) -> None:
    # Given room for one producer per partition, held by a
    dedup.max_producers = SHARES
    store(dedup, 1, {("t", "a"): ProducerMark({0: 9}, 1000)})
    # When b writes
    dedup.run(2, [("t", 0, 3, b"b", "b", 0), ("t", 0, 4, b"b", "b", 1)], now_ms=5000)
    # Then only b is remembered
    assert set(dedup.stored("t", 0)) == {("t", "b")}


def test_a_partition_of_anonymous_messages_keeps_no_marks(dedup: Dedup) -> None:
    out = dedup.run(1, [("t", 0, 1, b"y", None, -1), ("t", 0, 0, b"x", None, -1)])
    assert [r[3] for r in out] == [b"x", b"y"]
    assert dedup.marks.versions("t", 0) == [] and dedup.highs.value == {}


def test_kept_and_dropped_rows_are_counted_per_topic(dedup: Dedup) -> None:
    # Given a task with two topics: a retry in t, anonymous messages in u
    rows = [
        ("t", 0, 0, b"a", "p", 0),
        ("t", 0, 1, b"a again", "p", 0),
        ("t", 0, 2, b"b", "p", 1),
        ("u", 1, 0, b"x", None, -1),
        ("u", 1, 1, b"y", None, -1),
    ]
    # When the function decides them, then a batch of anonymous messages only
    dedup.run(1, rows)
    dedup.run(2, [("u", 1, 2, b"z", None, -1)])
    # Then each topic's kept and dropped rows are counted
    assert dedup.counts.value == {"t": (2, 1), "u": (3, 0)}


def test_the_wait_for_the_batch_is_counted_per_message(dedup: Dedup) -> None:
    # Given records written at 1.0 s and 1.9 s, and a batch whose write began at 2.0 s
    rows = [("t", 0, 0, b"a", None, -1, 0, 1000), ("t", 0, 1, b"b", None, -1, 0, 1900)]
    dedup.run(1, rows, started_ms=2000)
    # Then one waited 1 s and one 0.1 s
    counts, total = dedup.waits.value
    assert sum(counts) == 2 and total == pytest.approx(1.1)


def test_a_topic_created_again_starts_with_none_of_its_old_marks(dedup: Dedup) -> None:
    # Given marks of producers p and q on topic t as first created (incarnation 1)
    old = {("t", "p"): ProducerMark({0: 50}, 1000, 1), ("t", "q"): ProducerMark({0: 50}, 1000, 1)}
    store(dedup, 1, old)
    # When t, deleted and created again (incarnation 2), gets q's first messages
    rows = [("t", 0, 0, b"q1", "q", 1, 2), ("t", 0, 1, b"q2", "q", 2, 2)]
    out = dedup.run(2, rows, now_ms=2000)
    # Then they pass, q's mark starts over under incarnation 2, and p's mark on the old t is
    # gone
    assert [r[3] for r in out] == [b"q1", b"q2"]
    assert dedup.highs.value == {("t", "q"): (2, 2)}
    assert dedup.stored("t", 0) == {("t", "q"): ProducerMark({0: 2}, 2000, 2)}


def test_an_older_stamp_is_judged_as_the_topics_current_incarnation(dedup: Dedup) -> None:
    # Given p's mark at 5 under incarnation 2 of t
    store(dedup, 1, {("t", "p"): ProducerMark({0: 5}, 1, 2)})
    # When messages stamped with incarnation 1 arrive (an API replica that had not yet seen t
    # created again)
    rows = [("t", 0, 7, b"dup", "p", 5, 1), ("t", 0, 8, b"new", "p", 6, 1)]
    out = dedup.run(2, rows, now_ms=2000)
    # Then they are de-duplicated against incarnation 2's mark, which they raise
    assert [r[3] for r in out] == [b"new"]
    assert dedup.highs.value == {("t", "p"): (2, 6)}


def test_marks_stored_before_incarnations_read_as_incarnation_0() -> None:
    assert decode_marks('[["t","p",7,[[0,5]]]]') == {("t", "p"): ProducerMark({0: 5}, 7, 0)}


def test_every_partitions_newest_committed_marks_can_be_read_back(dedup: Dedup) -> None:
    # Given marks of two topics' partitions, the newest of one from a batch not yet committed
    store(dedup, 3, {("t", "p"): ProducerMark({0: 5}, 1000)}, partition=0)
    store(dedup, 9, {("t", "p"): ProducerMark({0: 8}, 1000)}, partition=0)
    store(dedup, 4, {("t", "q"): ProducerMark({1: 2}, 1000)}, partition=1)
    dedup.marks.save("u", 0, 2, encode_marks({("u", "p"): ProducerMark({0: 0}, 1000)}))
    # When everything committed below batch 9 is read (Redis forgot the producer marks)
    found = [decode_marks(text) for text in dedup.marks.all_below(9)]
    # Then each partition's newest version below 9 is there, nothing of batch 9
    merged = {k: m for marks in found for k, m in marks.items()}
    assert {k: m.high for k, m in merged.items()} == {("t", "p"): 5, ("t", "q"): 2, ("u", "p"): 0}
