"""Replay copies of main-log records: the ingest marks and their commit metadata."""

from __future__ import annotations

import pytest

from delivery.replays import IngestMarks, decode_marks, encode_marks


def test_a_record_not_above_the_highest_ingest_offset_read_is_a_copy() -> None:
    # Given records of ingest partition 0 at ingest offsets 0..3, main offsets 0..3
    marks = IngestMarks()
    assert all(marks.admit(offset, 0, offset) for offset in range(4))
    # When the batch holding ingest offsets 2 and 3 is written again, then new records follow
    got = [marks.admit(4, 0, 2), marks.admit(5, 0, 3), marks.admit(6, 0, 4)]
    # Then the two copies are recognised and the new record is not
    assert got == [False, False, True]


def test_ingest_partitions_are_judged_apart_and_records_without_an_origin_pass() -> None:
    marks = IngestMarks()
    assert marks.admit(0, 0, 10)
    assert marks.admit(1, 1, 3)
    assert marks.admit(2, None, None)
    assert not marks.admit(3, 1, 3)
    assert marks.admit(4, 0, 11)


def test_a_record_read_again_at_its_own_offset_is_not_judged() -> None:
    marks = IngestMarks()
    assert marks.admit(5, 0, 5)
    assert marks.admit(5, 0, 5)
    assert marks.admit(3, 0, 1)


def test_a_commit_carries_the_marks_of_the_records_below_it_only() -> None:
    # Given records at main offsets 0..5 from ingest offsets 10..15
    marks = IngestMarks({0: 9})
    for offset in range(6):
        marks.admit(offset, 0, 10 + offset)
    # When main offsets 3 and then 6 are committed
    # Then each commit carries the highest ingest offset below it, never one above
    assert marks.below(3) == {0: 12}
    assert marks.below(3) == {0: 12}
    assert marks.below(6) == {0: 15}


def test_a_successor_starting_from_committed_marks_skips_the_copies_after_the_commit() -> None:
    # Given a worker that read ingest offsets 0..4 and committed main offset 5
    first = IngestMarks()
    for offset in range(5):
        first.admit(offset, 0, offset)
    committed = decode_marks(encode_marks(first.below(5)))
    # When its successor reads on from main offset 5, where the batch 3..4 was written again
    successor = IngestMarks(committed)
    # Then it skips the copies and takes what is new
    assert [successor.admit(5, 0, 3), successor.admit(6, 0, 4), successor.admit(7, 0, 5)] == [
        False,
        False,
        True,
    ]


@pytest.mark.parametrize(
    ("text", "marks"),
    [
        ("0:41,3:7", {0: 41, 3: 7}),
        ("", {}),
        (None, {}),
        ("someone else's", {}),
        ("0:x", {}),
    ],
)
def test_commit_metadata(text: str | None, marks: dict[int, int]) -> None:
    assert decode_marks(text) == marks
    if marks:
        assert encode_marks(marks) == text
