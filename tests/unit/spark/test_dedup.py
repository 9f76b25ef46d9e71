"""The dedup decision (docs/design.md §3, per ingest partition) over plain rows: no Spark here."""

from __future__ import annotations

import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from spark.dedup import (
    OFFSET,
    PARTITION,
    PRODUCER,
    SEQUENCE,
    TOPIC,
    Incoming,
    ProducerKey,
    ProducerMark,
    admit,
    decide_batch,
    decide_frame,
    decode_marks,
    decode_partitions,
    encode_marks,
    encode_partitions,
    least_recently_seen,
    live_marks,
)


def msg(partition: int, offset: int, seq: int) -> Incoming:
    return Incoming(partition=partition, offset=offset, sequence=seq)


@pytest.mark.parametrize(
    ("marks", "message", "kept", "why"),
    [
        ({}, msg(0, 0, 0), True, "first message of a producer"),
        ({0: 5}, msg(0, 1, 6), True, "next sequence"),
        ({0: 5}, msg(0, 1, 9), True, "gaps are allowed"),
        ({0: 5}, msg(0, 1, 5), False, "retry of the last message"),
        ({0: 5}, msg(0, 1, 2), False, "older sequence on the same partition"),
        ({0: 5}, msg(1, 0, 4), True, "pipelined message of another partition, read later"),
        ({0: 5, 1: 4}, msg(1, 1, 4), False, "retry on the other partition"),
    ],
)
def test_admit_follows_pip6_per_partition(
    marks: dict[int, int], message: Incoming, kept: bool, why: str
) -> None:
    assert admit(ProducerMark(dict(marks)), message) is kept, why


def test_admit_advances_the_mark_only_for_kept_messages() -> None:
    # Given a producer at sequence 5 on partition 0
    mark = ProducerMark({0: 5})
    # When a duplicate and then a new message arrive
    admit(mark, msg(0, 1, 5))
    admit(mark, msg(1, 0, 8))
    # Then only the new one moved the mark, and the producer's high is the max over partitions
    assert mark.partitions == {0: 5, 1: 8}
    assert mark.high == 8


def test_batch_drops_retries_and_reports_each_producers_high() -> None:
    # Given two producers; p1 retries seq 1; p2 resends an older sequence on its partition
    producers = ["p1", "p1", "p1", "p2", "p2", None]
    messages = [msg(0, 0, 0), msg(0, 1, 1), msg(0, 2, 1), msg(1, 0, 7), msg(1, 1, 6)]
    messages.append(msg(1, 2, 0))
    # When the batch is decided
    decision = decide_batch(producers, messages, {}, now_ms=1000)
    # Then the retry and the older sequence are dropped; the anonymous message is kept
    assert decision.accepted == [True, True, False, True, False, True]
    assert decision.highs == {"p1": 1, "p2": 7}
    assert decision.marks["p1"] == ProducerMark({0: 1}, 1000)


def test_rows_are_decided_in_offset_order_whatever_order_they_come_in() -> None:
    # Given a retry listed before the original
    decision = decide_batch(["p", "p"], [msg(0, 9, 3), msg(0, 4, 3)], {}, now_ms=1)
    # Then the original (lower offset) is kept
    assert decision.accepted == [False, True]


def test_pipelined_producer_loses_nothing_whatever_the_read_order() -> None:
    # Given seq 0..5 sent at once round-robin over three partitions
    rows = [msg(s % 3, s // 3, s) for s in range(6)]
    # When one batch reads partition 2 entirely and the next batch the others
    first = decide_batch(["p"] * 2, [rows[2], rows[5]], {}, now_ms=1)
    second = decide_batch(["p"] * 4, [rows[i] for i in (0, 1, 3, 4)], first.marks, now_ms=2)
    # Then every message is kept
    assert first.accepted + second.accepted == [True] * 6


def test_batch_decision_does_not_modify_the_known_marks() -> None:
    known = {"p": ProducerMark({0: 1}, 5)}
    decide_batch(["p"], [msg(0, 5, 2)], known, now_ms=9)
    assert known == {"p": ProducerMark({0: 1}, 5)}


def test_replayed_batch_decides_exactly_as_before() -> None:
    known = {"p": ProducerMark({0: 3}, 5)}
    rows = [msg(0, 4, 3), msg(1, 0, 2), msg(0, 5, 4), msg(1, 1, 4)]
    assert decide_batch(["p"] * 4, rows, known, 9) == decide_batch(["p"] * 4, rows, known, 9)


@pytest.mark.parametrize(
    ("seen", "keep", "forgotten"),
    [
        ({"a": 1, "b": 2}, 2, []),
        ({"a": 1, "b": 2, "c": 3}, 2, ["a"]),
        ({"a": 5, "b": 2, "c": 3}, 1, ["b", "c"]),
        ({"b": 1, "a": 1}, 1, ["a"]),
    ],
)
def test_least_recently_seen_are_forgotten_beyond_the_bound(
    seen: dict[str, int], keep: int, forgotten: list[str]
) -> None:
    marks = {p: ProducerMark(last_seen_ms=t) for p, t in seen.items()}
    assert least_recently_seen(marks, keep) == forgotten


@pytest.mark.parametrize(
    ("partitions", "text"), [({}, ""), ({0: 5}, "0:5"), ({3: 40, 0: 12}, "0:12,3:40")]
)
def test_partition_marks_round_trip(partitions: dict[int, int], text: str) -> None:
    assert encode_partitions(partitions) == text
    assert decode_partitions(text) == partitions


Row = tuple[str, str | None, int, int, int]
"""(topic, producer or None, partition, offset, sequence)"""


def frame_of(rows: list[Row]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=[TOPIC, PRODUCER, PARTITION, OFFSET, SEQUENCE])


def rows_strategy() -> st.SearchStrategy[list[Row]]:
    row = st.tuples(
        st.sampled_from(["t", "u"]),
        st.sampled_from(["a", "b", "c", None]),
        st.integers(0, 2),
        st.integers(0, 5),
        st.integers(-1, 6),
    )
    # Offsets are unique within a partition, as in a log.
    return st.lists(row, max_size=40, unique_by=lambda r: (r[0], r[2], r[3]))


def marks_strategy() -> st.SearchStrategy[dict[ProducerKey, ProducerMark]]:
    mark = st.builds(
        ProducerMark,
        st.dictionaries(st.integers(0, 2), st.integers(-1, 6), max_size=3),
        st.integers(0, 100),
    )
    keys = st.tuples(st.sampled_from(["t", "u"]), st.sampled_from(["a", "b", "d"]))
    return st.dictionaries(keys, mark, max_size=4)


@given(rows_strategy(), marks_strategy(), st.integers(0, 200))
def test_frame_decision_is_the_row_by_row_rule(
    rows: list[Row], known: dict[ProducerKey, ProducerMark], now_ms: int
) -> None:
    # Given any rows of a few producers on a few topics and partitions, and any stored marks
    producers = [None if p is None else (t, p) for t, p, _, _, _ in rows]
    messages = [Incoming(part, offset, seq) for _, _, part, offset, seq in rows]
    before = {k: ProducerMark(dict(m.partitions), m.last_seen_ms) for k, m in known.items()}
    # When the whole frame is decided at once
    decision = decide_frame(frame_of(rows), known, now_ms)
    # Then it keeps, reports and remembers exactly what the row-by-row rule does
    expected = decide_batch(producers, messages, known, now_ms)
    assert decision.keep.tolist() == expected.accepted
    assert decision.highs == expected.highs
    assert decision.marks == expected.marks
    assert known == before


def test_frame_without_producers_keeps_everything_and_remembers_nothing() -> None:
    decision = decide_frame(frame_of([("t", None, 0, 0, -1), ("t", None, 0, 1, -1)]), {}, 5)
    assert decision.keep.tolist() == [True, True]
    assert decision.highs == {} and decision.marks == {}


def test_marks_idle_for_the_ttl_are_not_live() -> None:
    marks = {"old": ProducerMark({0: 1}, 1000), "fresh": ProducerMark({0: 2}, 1500)}
    assert live_marks(marks, now_ms=4000, ttl_ms=3000) == {"fresh": ProducerMark({0: 2}, 1500)}


def test_bucket_marks_round_trip_through_their_stored_form() -> None:
    marks = {("t", "p,:1"): ProducerMark({3: 40, 0: 12}, 7), ("u", "q"): ProducerMark({}, 0)}
    assert decode_marks(encode_marks(marks)) == marks
