"""The applyInPandasWithState function of the ingest job, with a stand-in for Spark's state."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from spark.dedup import ProducerMark, decode_marks, encode_marks
from spark.marks import ProducerHighs, merge_highs
from spark.metrics import TopicCounts, add_counts
from spark.processor import BUCKETS, DedupFunction

COLUMNS = ["topic", "partition", "offset", "value", "producer", "seq", "incarnation"]
OUTPUT = ["topic", "partition", "offset", "value"]


@dataclass
class FakeState:
    """The part of ``GroupState`` the function uses."""

    now_ms: int
    value: tuple[Any, ...] | None = None

    @property
    def exists(self) -> bool:
        return self.value is not None

    @property
    def get(self) -> tuple[Any, ...]:
        assert self.value is not None
        return self.value

    def update(self, value: tuple[Any, ...]) -> None:
        self.value = value

    def remove(self) -> None:
        self.value = None

    def getCurrentProcessingTimeMs(self) -> int:  # noqa: N802 (Spark's name)
        return self.now_ms


@dataclass
class FakeHighs:
    value: ProducerHighs = field(default_factory=dict)

    def add(self, highs: ProducerHighs) -> None:
        merge_highs(self.value, highs)


@dataclass
class FakeCounts:
    value: TopicCounts = field(default_factory=dict)

    def add(self, counts: TopicCounts) -> None:
        add_counts(self.value, counts)


def run(
    function: DedupFunction, state: FakeState, rows: list[tuple[Any, ...]]
) -> list[tuple[Any, ...]]:
    """Feed ``rows`` as two Arrow-sized chunks, as Spark may; return the emitted rows. A row
    without an incarnation has incarnation 0."""
    frame = pd.DataFrame([row + (0,) * (len(COLUMNS) - len(row)) for row in rows], columns=COLUMNS)
    chunks: Iterator[pd.DataFrame] = iter(
        [frame.iloc[: len(rows) // 2], frame.iloc[len(rows) // 2 :]]
    )
    out = pd.concat(list(function(("bucket",), chunks, state)))  # type: ignore[arg-type]
    return list(out.itertuples(index=False, name=None))


def dedup(
    ttl_ms: int = 60_000, max_producers: int = 1000, counts: FakeCounts | None = None
) -> tuple[DedupFunction, FakeHighs]:
    highs = FakeHighs()
    function = DedupFunction(
        ttl_ms,
        max_producers,
        OUTPUT,
        highs,  # type: ignore[arg-type]
        counts or FakeCounts(),  # type: ignore[arg-type]
    )
    return function, highs


def test_bucket_rows_leave_deduplicated_in_log_order() -> None:
    # Given a bucket's rows out of order: two partitions, a retry, an anonymous message
    function, highs = dedup()
    state = FakeState(now_ms=1000)
    rows = [
        ("t", 1, 0, b"b0", "p", 0),
        ("t", 0, 1, b"a1", "p", 1),
        ("t", 0, 0, b"a0", "p", 0),
        ("t", 0, 2, b"a1 again", "p", 1),
        ("t", 1, 1, b"free", None, -1),
    ]
    # When the function decides them
    out = run(function, state, rows)
    # Then the retry is gone and the rest come out by (partition, offset)
    assert out == [
        ("t", 0, 0, b"a0"),
        ("t", 0, 1, b"a1"),
        ("t", 1, 0, b"b0"),
        ("t", 1, 1, b"free"),
    ]
    assert highs.value == {("t", "p"): (0, 1)}
    assert decode_marks(state.get[0]) == {("t", "p"): ProducerMark({0: 1, 1: 0}, 1000)}


def test_next_batch_is_judged_against_the_stored_marks() -> None:
    # Given a bucket whose state remembers producer p at sequence 5 on partition 0
    function, _ = dedup()
    state = FakeState(now_ms=2000, value=(encode_marks({("t", "p"): ProducerMark({0: 5}, 1000)}),))
    # When p resends 5 and sends 6
    out = run(function, state, [("t", 0, 7, b"old", "p", 5), ("t", 0, 8, b"new", "p", 6)])
    # Then only 6 passes
    assert out == [("t", 0, 8, b"new")]


def test_marks_idle_for_the_ttl_no_longer_judge() -> None:
    # Given a mark last seen at 1000 and a 3 s TTL
    function, _ = dedup(ttl_ms=3000)
    state = FakeState(now_ms=4000, value=(encode_marks({("t", "p"): ProducerMark({0: 5}, 1000)}),))
    # When an older sequence arrives once the TTL has passed
    out = run(function, state, [("t", 0, 9, b"late", "p", 2), ("t", 0, 10, b"x", None, -1)])
    # Then it is accepted, and the state holds only the fresh mark
    assert [r[3] for r in out] == [b"late", b"x"]
    assert decode_marks(state.get[0]) == {("t", "p"): ProducerMark({0: 2}, 4000)}


def test_each_bucket_forgets_its_least_recently_seen_beyond_its_share() -> None:
    # Given room for one producer per bucket, held by a
    function, _ = dedup(max_producers=BUCKETS)
    state = FakeState(now_ms=5000, value=(encode_marks({("t", "a"): ProducerMark({0: 9}, 1000)}),))
    # When b writes
    run(function, state, [("t", 0, 3, b"b", "b", 0), ("t", 0, 4, b"b", "b", 1)])
    # Then only b is remembered
    assert set(decode_marks(state.get[0])) == {("t", "b")}


def test_a_bucket_of_anonymous_messages_keeps_no_state() -> None:
    function, highs = dedup()
    state = FakeState(now_ms=1)
    out = run(function, state, [("t", 0, 1, b"y", None, -1), ("t", 0, 0, b"x", None, -1)])
    assert [r[3] for r in out] == [b"x", b"y"]
    assert not state.exists and highs.value == {}


def test_kept_and_dropped_rows_are_counted_per_topic() -> None:
    # Given a bucket with two topics: a retry in t, anonymous messages in u
    counts = FakeCounts()
    function, _ = dedup(counts=counts)
    rows = [
        ("t", 0, 0, b"a", "p", 0),
        ("t", 0, 1, b"a again", "p", 0),
        ("t", 0, 2, b"b", "p", 1),
        ("u", 1, 0, b"x", None, -1),
        ("u", 1, 1, b"y", None, -1),
    ]
    # When the function decides them, then a batch of anonymous messages only
    run(function, FakeState(now_ms=1), rows)
    run(function, FakeState(now_ms=2), [("u", 1, 2, b"z", None, -1)])
    # Then each topic's kept and dropped rows are counted
    assert counts.value == {"t": (2, 1), "u": (3, 0)}


def test_a_topic_created_again_starts_with_none_of_its_old_marks() -> None:
    # Given marks of producers p and q on topic t as first created (incarnation 1), and of p
    # on topic u
    function, highs = dedup()
    old = {
        ("t", "p"): ProducerMark({0: 50}, 1000, 1),
        ("t", "q"): ProducerMark({0: 50}, 1000, 1),
        ("u", "p"): ProducerMark({0: 50}, 1000, 1),
    }
    state = FakeState(now_ms=2000, value=(encode_marks(old),))
    # When t, deleted and created again (incarnation 2), gets q's first messages
    out = run(function, state, [("t", 0, 0, b"q1", "q", 1, 2), ("t", 0, 1, b"q2", "q", 2, 2)])
    # Then they pass, q's mark starts over under incarnation 2, p's mark on the old t is
    # gone, and u is untouched
    assert [r[3] for r in out] == [b"q1", b"q2"]
    assert highs.value == {("t", "q"): (2, 2)}
    assert decode_marks(state.get[0]) == {
        ("t", "q"): ProducerMark({0: 2}, 2000, 2),
        ("u", "p"): ProducerMark({0: 50}, 1000, 1),
    }


def test_an_older_stamp_is_judged_as_the_topics_current_incarnation() -> None:
    # Given p's mark at 5 under incarnation 2 of t
    function, highs = dedup()
    state = FakeState(now_ms=2000, value=(encode_marks({("t", "p"): ProducerMark({0: 5}, 1, 2)}),))
    # When messages stamped with incarnation 1 arrive (an API replica that had not yet seen t
    # created again)
    out = run(function, state, [("t", 0, 7, b"dup", "p", 5, 1), ("t", 0, 8, b"new", "p", 6, 1)])
    # Then they are de-duplicated against incarnation 2's mark, which they raise
    assert [r[3] for r in out] == [b"new"]
    assert highs.value == {("t", "p"): (2, 6)}


def test_marks_stored_before_incarnations_read_as_incarnation_0() -> None:
    assert decode_marks('[["t","p",7,[[0,5]]]]') == {("t", "p"): ProducerMark({0: 5}, 7, 0)}
