from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from delivery.offsets import OffsetTracker


@pytest.mark.parametrize(
    ("reads", "finishes", "expected"),
    [
        ([], [], None),  # nothing read, no position: nothing to commit
        ([5], [], 5),  # the first unfinished
        ([5], [5], 6),  # all finished: after the last read
        ([5, 6, 7], [6, 7], 5),  # out of order: stuck behind 5
        ([5, 6, 7], [5, 7], 6),
        ([5, 6, 7], [7, 6, 5], 8),
        ([0, 1, 2, 10, 11], [0, 1, 2, 10], 11),  # gaps in offsets are fine
        ([0, 1, 2, 10, 11], [0, 1, 2, 11], 10),
    ],
)
def test_committable_offset(reads: list[int], finishes: list[int], expected: int | None) -> None:
    tracker = OffsetTracker()
    for offset in reads:
        tracker.read(offset)
    for offset in finishes:
        tracker.finish(offset)
    assert tracker.committable() == expected


def test_a_start_position_is_committable_before_any_read() -> None:
    assert OffsetTracker(42).committable() == 42


def test_rewind_holds_the_commit_at_the_held_record() -> None:
    # Given records 10 and 11 finished and 12 read but held back (seek back to 12)
    tracker = OffsetTracker()
    for offset in (10, 11):
        tracker.read(offset)
        tracker.finish(offset)
    tracker.rewind(12)
    # Then the commit stops at 12 until it is read again and finished
    assert tracker.committable() == 12
    tracker.read(12)
    assert tracker.committable() == 12
    tracker.finish(12)
    assert tracker.committable() == 13


def test_reading_again_after_a_seek_back_reopens_a_finished_offset() -> None:
    tracker = OffsetTracker()
    for offset in (0, 1, 2):
        tracker.read(offset)
        tracker.finish(offset)
    tracker.rewind(1)
    tracker.read(1)
    assert tracker.committable() == 1
    tracker.finish(1)
    tracker.read(2)
    tracker.finish(2)
    assert tracker.committable() == 3


def test_an_open_offset_cannot_be_read_twice_or_finished_unread() -> None:
    tracker = OffsetTracker()
    tracker.read(3)
    with pytest.raises(ValueError, match="already open"):
        tracker.read(3)
    with pytest.raises(ValueError, match="not open"):
        tracker.finish(4)


@given(st.permutations(list(range(30))), st.integers(0, 30))
def test_committable_is_the_lowest_unfinished(order: list[int], count: int) -> None:
    # Given 30 offsets read in order and an arbitrary subset finished in any order
    tracker = OffsetTracker()
    for offset in range(30):
        tracker.read(offset)
    finished = order[:count]
    for offset in finished:
        tracker.finish(offset)
    # Then the commit is the lowest unfinished offset, never past one
    unfinished = set(range(30)) - set(finished)
    assert tracker.committable() == (min(unfinished) if unfinished else 30)
