"""Reading producer marks: a mark of a deleted topic does not answer for its successor."""

from __future__ import annotations

from state.producer_marks import last_sequence, parse_mark


def test_a_mark_is_its_incarnation_and_sequence() -> None:
    assert parse_mark(b"1700000000000:41") == (1_700_000_000_000, 41)
    assert parse_mark("41") == (0, 41)  # written before incarnations


def test_only_the_topics_current_incarnation_answers() -> None:
    assert last_sequence(b"5:41", topic_incarnation=5) == 41
    assert last_sequence(b"4:41", topic_incarnation=5) == -1  # the deleted topic's
    assert last_sequence(b"41", topic_incarnation=5) == 41
    assert last_sequence(None, topic_incarnation=5) == -1
