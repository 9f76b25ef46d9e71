from __future__ import annotations

from dataclasses import replace

import pytest

from setu.envelope import Envelope
from setu.ordering.dead_letters import DeadLetter, Selector, choose, is_live, parse_cursor
from setu.ordering.groups import Kind
from setu.ordering.records import Record
from setu.ordering.state import EMPTY_COUNTS, GroupState
from setu.ordering.tiers import DLQ


def letter(
    offset: int, message: str, group: str | None, kind: Kind, failed_at: int = 10
) -> DeadLetter:
    env = Envelope(message, b"", group_id=group, failed_at_ms=failed_at)
    return DeadLetter(0, Record(DLQ, offset, env, kind))


def parked_group(n: int, failed_at: int = 10, released: bool = False) -> GroupState:
    counts = list(EMPTY_COUNTS)
    counts[DLQ] = n
    return GroupState(counts=tuple(counts), head="a1", released=released, failed_at_ms=failed_at)


# Group a parked with three letters; b1, b2 dead on their own (skip policy); c's letter stray.
LETTERS = [
    letter(0, "a1", "a", Kind.HEAD, failed_at=10),
    letter(1, "b1", "b", Kind.SKIP, failed_at=20),
    letter(2, "a2", "a", Kind.PARK, failed_at=30),
    letter(3, "b2", "b", Kind.SKIP, failed_at=40),
    letter(4, "a3", "a", Kind.PARK, failed_at=50),
    letter(5, "u1", None, Kind.DEAD, failed_at=60),
]
STATES = {"a": parked_group(3, failed_at=10)}
PARTITIONS = {"a": 0}


@pytest.mark.parametrize(
    ("selector", "groups", "letters", "requeued"),
    [
        (Selector(group_ids=frozenset({"a"})), {"a"}, set(), 3),
        (Selector(group_ids=frozenset({"b"})), set(), {1, 3}, 2),
        (Selector(group_ids=frozenset({"a", "b"})), {"a"}, {1, 3}, 5),
        # Any letter of a parked group releases the whole group, in order.
        (Selector(message_ids=frozenset({"a3"})), {"a"}, set(), 3),
        (Selector(message_ids=frozenset({"b2", "u1"})), set(), {3, 5}, 2),
        # failed_before: a group by its head's failure, single letters by their own.
        (Selector(failed_before=15), {"a"}, set(), 3),
        (Selector(failed_before=45), {"a"}, {1, 3}, 5),
        (Selector(failed_before=5), set(), set(), 0),
        (Selector(group_ids=frozenset({"nobody"})), set(), set(), 0),
    ],
)
def test_choose(selector: Selector, groups: set[str], letters: set[int], requeued: int) -> None:
    out = choose(LETTERS, STATES, PARTITIONS, selector)
    assert set().union(*out.groups.values()) == groups
    assert set().union(*out.letters.values()) == letters
    assert out.requeued == requeued


def test_a_group_already_released_is_not_counted_again() -> None:
    out = choose(
        LETTERS,
        {"a": parked_group(3, released=True)},
        PARTITIONS,
        Selector(group_ids=frozenset({"a"})),
    )
    assert (out.groups, out.requeued) == ({}, 0)


@pytest.mark.parametrize(
    ("after", "expected"),
    [(None, (0, -1)), ("", (0, -1)), ("2:40", (2, 41)), ("0:0", (0, 1))],
)
def test_cursor(after: str | None, expected: tuple[int, int]) -> None:
    assert parse_cursor(after) == expected


@pytest.mark.parametrize("after", ["x", "1", "1:", ":3", "-1:3", "1:a"])
def test_a_malformed_cursor_is_refused(after: str) -> None:
    with pytest.raises(ValueError, match="cursor"):
        parse_cursor(after)


def dlq_state(n: int, dlq_from: int, **changes: object) -> GroupState:
    counts = list(EMPTY_COUNTS)
    counts[DLQ] = n
    return replace(GroupState(counts=tuple(counts), head="a1", dlq_from=dlq_from), **changes)


@pytest.mark.parametrize(
    ("dead", "state", "redelivered", "live"),
    [
        # A group's letter is live while its group is parked in the DLQ from it or before.
        (LETTERS[0], dlq_state(3, 0), set(), True),
        (LETTERS[2], dlq_state(2, 1, released=True), set(), True),
        (LETTERS[0], dlq_state(2, 1, released=True), set(), False),  # delivered again
        (LETTERS[0], None, set(), False),  # the group is healthy: all delivered
        (LETTERS[0], replace(dlq_state(0, -1), counts=(0, 1) + (0,) * 9), set(), False),
        (LETTERS[0], dlq_state(3, 0, lap=2), set(), True),  # on a lap, still parked on it
        # A single letter until it is delivered (or sent round) again.
        (LETTERS[5], None, set(), True),
        (LETTERS[5], None, {5}, False),
        (LETTERS[1], dlq_state(3, 0), {5}, True),
    ],
)
def test_which_dead_letters_are_live(
    dead: DeadLetter, state: GroupState | None, redelivered: set[int], live: bool
) -> None:
    assert is_live(dead, state, redelivered) is live


def test_a_copy_of_a_worker_that_had_lost_the_partition_is_never_live() -> None:
    # Given epoch 4 took the partition over when the DLQ ended at offset 3
    fences = {4: {DLQ: 3}}
    stale = DeadLetter(0, replace(LETTERS[4].record, epoch=3))  # a3 at offset 4, epoch 3
    own = DeadLetter(0, replace(LETTERS[4].record, epoch=4))
    # Then the stalled worker's copy is hidden, the owner's shown
    assert not is_live(stale, dlq_state(3, 0), set(), fences)
    assert is_live(own, dlq_state(3, 0), set(), fences)
    assert is_live(stale, dlq_state(3, 0), set())


def test_a_letter_parked_again_after_a_lap_shows_its_latest_failure() -> None:
    # Given a1 parked again after a lap: 5 attempts, last answered 503
    state = dlq_state(3, 0, attempts=5, last_status=503, reason="http 503", failed_at_ms=99)
    # Then its letter shows the lap's failure, and the letters behind it their own
    view = LETTERS[0].view(state)
    assert (view["attempts"], view["last_status"], view["error"], view["failed_at"]) == (
        5,
        503,
        "http 503",
        99,
    )
    assert LETTERS[2].view(state)["attempts"] == 0
    assert LETTERS[0].view(None)["attempts"] == 0


def test_a_group_on_a_lap_is_not_released_twice() -> None:
    states = {"a": dlq_state(3, 0, lap=1)}
    releases = choose(LETTERS, states, PARTITIONS, Selector(group_ids=frozenset({"a"})))
    assert (releases.groups, releases.requeued) == ({}, 0)
