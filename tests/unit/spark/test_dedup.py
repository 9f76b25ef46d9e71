"""The dedup decision (DESIGN §3) over plain rows: no Spark here."""

from __future__ import annotations

import pytest

from spark.dedup import (
    REORDER_WINDOW_MS,
    Incoming,
    ProducerMark,
    admit,
    decide_batch,
    decode_partitions,
    encode_partitions,
    least_recently_seen,
    merge_order,
)

LATER = 100 + REORDER_WINDOW_MS + 1


def msg(partition: int, offset: int, ts: int, seq: int) -> Incoming:
    return Incoming(partition=partition, offset=offset, timestamp_ms=ts, sequence=seq)


@pytest.mark.parametrize(
    ("mark", "message", "kept", "why"),
    [
        (ProducerMark(), msg(0, 0, 100, 0), True, "first message of a producer"),
        (ProducerMark(5, 100, {0: 5}), msg(0, 1, 200, 6), True, "next sequence"),
        (ProducerMark(5, 100, {0: 5}), msg(0, 1, 200, 9), True, "gaps are allowed"),
        (ProducerMark(5, 100, {0: 5}), msg(0, 1, 200, 5), False, "retry of the last message"),
        (ProducerMark(5, 100, {0: 5}), msg(0, 1, 50, 5), False, "retry read late, same partition"),
        (ProducerMark(5, 100, {0: 5}), msg(1, 0, LATER, 3), False, "older sequence sent later"),
        (ProducerMark(5, 100, {0: 5}), msg(1, 0, 90, 4), True, "produced earlier, read later"),
        (ProducerMark(5, 100, {0: 5}), msg(1, 0, 100, 4), True, "produced in the same ms"),
        (ProducerMark(5, 100, {0: 5}), msg(1, 0, 300, 4), True, "pipelined to two partitions"),
        (ProducerMark(5, 100, {0: 5, 1: 4}), msg(1, 1, 90, 4), False, "late, but a duplicate"),
    ],
)
def test_admit_follows_pip6_in_produce_order(
    mark: ProducerMark, message: Incoming, kept: bool, why: str
) -> None:
    assert admit(mark, message) is kept, why


def test_admit_advances_the_mark_only_for_kept_messages() -> None:
    # Given a producer at sequence 5 on partition 0
    mark = ProducerMark(5, 100, {0: 5})
    # When a duplicate and then a new message arrive
    admit(mark, msg(0, 1, 200, 5))
    admit(mark, msg(1, 0, 300, 8))
    # Then only the new one moved the mark
    assert mark == ProducerMark(8, 300, {0: 5, 1: 8})


def test_pipelined_producer_loses_nothing_whatever_the_read_order() -> None:
    # Given seq 0..5 sent at once round-robin over three partitions, appended a little out of
    # order in time (seq 5 got the earliest timestamp)
    rows = [msg(s % 3, s // 3, ts, s) for s, ts in enumerate([103, 101, 104, 102, 105, 100])]
    # When a batch reads partition 2 entirely and the others only later
    first = decide_batch(["p"] * 2, [rows[2], rows[5]], {}, now_ms=1)
    second = decide_batch(["p"] * 4, [rows[i] for i in (0, 1, 3, 4)], first.marks, now_ms=2)
    # Then every message is kept
    assert first.accepted + second.accepted == [True] * 6


def test_merge_order_keeps_offsets_in_order_within_a_partition() -> None:
    # Given partition 0 whose second message carries an earlier clock (skewed API host)
    messages = [msg(0, 0, 100, 1), msg(0, 1, 90, 2), msg(1, 0, 95, 3)]
    # Then offset order holds within partition 0 and partition 1 interleaves by time
    assert merge_order(messages) == [2, 0, 1]


def test_batch_drops_retries_and_flags_each_producers_high() -> None:
    # Given two producers; p1 retries seq 1 and p2 sends an older sequence later
    producers = ["p1", "p1", "p1", "p2", "p2"]
    messages = [msg(0, 0, 10, 0), msg(0, 1, 11, 1), msg(0, 2, 12, 1), msg(1, 0, 10, 7)]
    messages.append(msg(2, 0, 10 + REORDER_WINDOW_MS + 1, 6))
    # When the batch is decided
    decision = decide_batch(producers, messages, {}, now_ms=1000)
    # Then the retry and the stale message are dropped
    assert decision.accepted == [True, True, False, True, False]
    assert decision.high_rows == [1, 3]
    assert decision.marks["p1"] == ProducerMark(1, 11, {0: 1}, 1000)
    assert decision.marks["p2"].high == 7


def test_batch_reads_a_partition_that_lags_behind_without_loss() -> None:
    # Given seq 0..5 produced in turn over two partitions; batch 1 read partition 1 further
    first = decide_batch(["p"] * 2, [msg(1, 0, 11, 1), msg(1, 1, 13, 3)], {}, now_ms=1)
    # When the rest of partition 0 (seq 0 and 2, produced before 3) is read in batch 2
    second = decide_batch(
        ["p"] * 3, [msg(0, 0, 10, 0), msg(0, 1, 12, 2), msg(0, 2, 14, 4)], first.marks, now_ms=2
    )
    # Then nothing is lost
    assert second.accepted == [True, True, True]
    assert second.marks["p"].high == 4


def test_batch_decision_does_not_modify_the_known_marks() -> None:
    known = {"p": ProducerMark(1, 10, {0: 1}, 5)}
    decide_batch(["p"], [msg(0, 5, 20, 2)], known, now_ms=9)
    assert known == {"p": ProducerMark(1, 10, {0: 1}, 5)}


def test_replayed_batch_decides_exactly_as_before() -> None:
    known = {"p": ProducerMark(3, 10, {0: 3}, 5)}
    rows = [msg(0, 4, 20, 3), msg(1, 0, 15, 2), msg(0, 5, 21, 4), msg(1, 1, 30, 4)]
    once = decide_batch(["p"] * 4, rows, known, now_ms=9)
    again = decide_batch(["p"] * 4, rows, known, now_ms=9)
    assert once == again


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
