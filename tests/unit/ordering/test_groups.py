from __future__ import annotations

from dataclasses import replace

import pytest

from setu.ordering import groups
from setu.ordering.groups import Kind, Route
from setu.ordering.state import EMPTY_COUNTS, NOTHING_DONE, GroupState
from setu.ordering.tiers import DLQ, MAIN, next_tier, parse_tier_name, tier_name


def marks(**by_tier: int) -> tuple[int, ...]:
    """Done marks from t0=.., t1=.., dlq=.. (-1 elsewhere)."""
    done = list(NOTHING_DONE)
    for name, offset in by_tier.items():
        done[DLQ if name == "dlq" else int(name[1:])] = offset
    return tuple(done)


def state(
    head: str | None = None, released: bool = False, dlq_from: int = -1, **counts: int
) -> GroupState:
    """A state from counts given as t1=.., t2=.., dlq=.."""
    c = list(EMPTY_COUNTS)
    for name, n in counts.items():
        c[DLQ if name == "dlq" else int(name[1:])] = n
    return GroupState(counts=tuple(c), head=head, released=released, dlq_from=dlq_from)


@pytest.mark.parametrize(
    ("st", "tier", "message", "offset", "route"),
    [
        # Main log: a healthy group delivers, a failed one parks.
        (None, MAIN, "m", 0, Route.DELIVER),
        (state("a", t1=1), MAIN, "m", 0, Route.PARK),
        # The head tier: the head (or the first reached, when unknown) delivers; others wait.
        (state("a", t1=3), 1, "a", 0, Route.DELIVER),
        (state("a", t1=3), 1, "b", 0, Route.WAIT),
        (state(None, t1=3), 1, "b", 0, Route.DELIVER),
        # Below the head tier: follow the group up.
        (state("a", t1=2, t2=1), 1, "b", 0, Route.FORWARD),
        # No state accounts for a retry copy: deliver it on its own.
        (None, 1, "x", 0, Route.STRAY),
        (state("a", t2=1), 1, "x", 0, Route.STRAY),
        # The DLQ: parked letters wait for an operator; released ones deliver in order.
        (state("a", dlq=2, dlq_from=10), DLQ, "a", 10, Route.SKIP),
        (state("a", released=True, dlq=2, dlq_from=10), DLQ, "a", 10, Route.DELIVER),
        (state("a", released=True, dlq=2, dlq_from=10), DLQ, "b", 11, Route.WAIT),
        (state(None, released=True, dlq=2, dlq_from=11), DLQ, "b", 11, Route.DELIVER),
        (state(None, released=True, dlq=2, dlq_from=11), DLQ, "a", 10, Route.SKIP),  # done
        (None, DLQ, "a", 10, Route.SKIP),
        (state("a", t1=1), DLQ, "a", 10, Route.SKIP),
        # At or below the group's done mark in its tier: finished already (read again after
        # Redis forgot its outcome).
        (replace(state("a", t1=1), done=marks(t0=4)), MAIN, "m", 4, Route.SKIP),
        (replace(state("a", t1=1), done=marks(t0=4)), MAIN, "m", 5, Route.PARK),
        (replace(state(None, t1=2), done=marks(t1=7)), 1, "b", 7, Route.SKIP),
        (replace(state(None, t1=2), done=marks(t1=7)), 1, "b", 8, Route.DELIVER),
    ],
)
def test_route(st: GroupState | None, tier: int, message: str, offset: int, route: Route) -> None:
    assert groups.route(st, tier, message, offset) is route


@pytest.mark.parametrize(
    ("st", "route", "tier", "to"),
    [
        (state("a", t1=1), Route.PARK, MAIN, 1),
        (state("a", t1=1, t3=1), Route.PARK, MAIN, 1),  # the lowest non-empty tier
        (state("a", t3=1), Route.PARK, MAIN, 3),
        (state("a", dlq=1), Route.PARK, MAIN, DLQ),
        (state("a", t1=1, t2=1, t3=1), Route.FORWARD, 1, 2),  # next non-empty above, not the head's
        (state("a", t1=1, t3=1), Route.FORWARD, 1, 3),
        (state("a", t2=1, dlq=1), Route.FORWARD, 2, DLQ),
    ],
)
def test_target(st: GroupState, route: Route, tier: int, to: int) -> None:
    assert groups.target(st, route, tier) == to


def test_a_healthy_group_fails_into_the_first_tier() -> None:
    new = groups.head_failed(None, MAIN, 1, "a", now_ms=5)
    assert (new.head, new.head_tier, new.parked, new.failed_at_ms) == ("a", 1, 1, 5)


def test_a_head_moving_up_keeps_the_group_count() -> None:
    st = groups.parked(groups.head_failed(None, MAIN, 1, "a"), 1, 2)
    moved = groups.head_failed(st, 1, 2, "a")
    assert moved.counts[1:3] == (2, 1)
    assert moved.head_tier == 2 and moved.parked == 3


def test_a_head_dead_lettered_parks_the_group_at_its_dlq_offset() -> None:
    st = groups.head_failed(state("a", t2=1, t1=1), 2, DLQ, "a", dlq_offset=77)
    assert (st.head_tier, st.dlq_from, st.released) == (DLQ, 77, False)


@pytest.mark.parametrize(
    ("st", "tier", "offset", "expected"),
    [
        (state("a", t1=1), 1, 5, None),  # the last message: healthy again
        (state("a", t1=3), 1, 5, state(None, t1=2)),  # the next in that tier is head now
        (state("a", t1=1, t2=0, dlq=0), 1, 5, None),
        (state("a", t2=1, t1=2), 2, 5, state(None, t1=2)),  # next head from the tier below
        (
            state("a", released=True, dlq=2, dlq_from=10),
            DLQ,
            10,
            state(None, released=True, dlq=1, dlq_from=11),
        ),
        (state("a", released=True, dlq=1, t1=1, dlq_from=10), DLQ, 10, state(None, t1=1)),
    ],
)
def test_head_done(st: GroupState, tier: int, offset: int, expected: GroupState | None) -> None:
    new = groups.head_done(st, tier, offset)
    if expected is None:
        assert new is None
    else:
        assert new is not None
        assert (new.counts, new.head, new.released, new.dlq_from) == (
            expected.counts,
            expected.head,
            expected.released,
            expected.dlq_from,
        )


def test_every_change_bumps_the_version() -> None:
    first = groups.head_failed(None, MAIN, 1, "a")
    assert first.version == 1
    assert groups.parked(first, 1).version == 2
    assert groups.forwarded(groups.parked(first, 1), 1, 2).version == 3
    assert groups.head_done(groups.parked(first, 1), 1, 0) == replace(
        groups.parked(first, 1), head=None, counts=first.counts, version=3
    )


def test_only_a_group_parked_in_the_dlq_can_be_released() -> None:
    assert groups.released(state("a", dlq=1, dlq_from=3)).released
    with pytest.raises(ValueError, match="parked in the DLQ"):
        groups.released(state("a", t1=1))


def test_a_released_letter_failing_again_reparks_the_group_on_it() -> None:
    failure = groups.Failure(attempts=5, status=503, reason="http 503", at_ms=99)
    st = groups.reparked(state(None, released=True, dlq=2, dlq_from=11), "b", 11, failure)
    assert (st.head, st.released, st.dlq_from, st.failed_at_ms) == ("b", False, 11, 99)
    assert (st.attempts, st.last_status, st.reason, st.lap) == (5, 503, "http 503", 0)


def test_a_lap_keeps_the_letter_counted_in_the_dlq_and_tracks_its_copy() -> None:
    # Given a released group of two letters from offset 11
    released = state(None, released=True, dlq=2, dlq_from=11)
    assert groups.lap_pending(released, "b", 11)
    # When its head (at 11) fails again and its copy goes to rq.1, then rq.2
    on_lap = groups.apply_copy(
        released, Kind.LAP, DLQ, 1, "b", copy_offset=0, source_offset=11, now_ms=5, attempts=3
    )
    assert on_lap is not None
    on_lap = groups.apply_copy(
        on_lap, Kind.LAP, 1, 2, "b", copy_offset=0, source_offset=0, now_ms=6, attempts=4
    )
    # Then the group waits for the copy in rq.2, still parked on the letter, not releasable
    assert on_lap is not None
    assert (on_lap.lap, on_lap.head, on_lap.dlq_from, on_lap.released) == (2, "b", 11, False)
    assert (on_lap.counts[DLQ], on_lap.head_tier, on_lap.attempts) == (2, DLQ, 4)
    assert not groups.releasable(on_lap)
    assert not groups.lap_pending(on_lap, "b", 11)
    # And only that copy is attempted
    assert groups.route_lap(on_lap, 2, "b") is Route.DELIVER
    assert groups.route_lap(on_lap, 1, "b") is Route.SKIP
    assert groups.route_lap(on_lap, 2, "c") is Route.SKIP
    # And a main message parks in the DLQ behind the letters
    assert groups.route(on_lap, MAIN, "d", 0) is Route.PARK
    assert groups.target(on_lap, Route.PARK, MAIN) == DLQ
    # When the copy is delivered, the group is released again from the next letter on
    done = groups.lap_done(on_lap)
    assert done is not None
    assert (done.counts[DLQ], done.dlq_from, done.released, done.lap, done.head) == (
        1,
        12,
        True,
        0,
        None,
    )
    assert done.attempts == 0


def test_a_lap_of_the_last_letter_leaves_the_group_healthy() -> None:
    on_lap = replace(state("b", dlq=1, dlq_from=11), lap=1)
    assert groups.lap_done(on_lap) is None


def test_counts_never_go_negative() -> None:
    with pytest.raises(ValueError, match="would hold -1"):
        groups.forwarded(state("a", t2=1), 1, 2)


@pytest.mark.parametrize(
    ("kind", "changes_state", "ordered"),
    [
        (Kind.HEAD, True, True),
        (Kind.PARK, True, True),
        (Kind.FORWARD, True, True),
        (Kind.SKIP, True, False),
        (Kind.RETRY, False, False),
        (Kind.DEAD, False, False),
        (Kind.LAP, True, True),
    ],
)
def test_kinds(kind: Kind, changes_state: bool, ordered: bool) -> None:
    assert (kind.changes_state, kind.ordered) == (changes_state, ordered)


@pytest.mark.parametrize(
    ("tier", "tiers", "expected"),
    [(MAIN, 3, 1), (1, 3, 2), (3, 3, DLQ), (MAIN, 0, DLQ), (5, 3, DLQ)],
)
def test_next_tier(tier: int, tiers: int, expected: int) -> None:
    assert next_tier(tier, tiers) == expected


@pytest.mark.parametrize(("tier", "name"), [(MAIN, "main"), (1, "rq.1"), (9, "rq.9"), (DLQ, "dlq")])
def test_tier_names_round_trip(tier: int, name: str) -> None:
    assert tier_name(tier) == name
    assert parse_tier_name(name) == tier


@pytest.mark.parametrize(
    ("before", "after", "finished", "landed", "done"),
    [
        # A healthy group's main message failed (offset 5) and its copy landed at rq.1:12:
        # the message is finished in main, and nothing of the group below 12 waits in rq.1.
        (None, state("m", t1=1), [(MAIN, 5)], {1: 12}, marks(t0=5, t1=11)),
        # Parked into a tier that already holds the group: only the source is marked.
        (state("a", t1=1), state("a", t1=2), [(MAIN, 9)], {1: 20}, marks(t0=9)),
        # Parked behind a held head, which counts in rq.1 but waits in the main log: the first
        # record of the group in rq.1, so nothing of it below 20 waits there.
        (
            replace(state("a", t1=1), held=4),
            replace(state("a", t1=2), held=4),
            [(MAIN, 9)],
            {1: 20},
            marks(t0=9, t1=19),
        ),
        # The head delivered from rq.2 at 3.
        (state("a", t2=2), state(None, t2=1), [(2, 3)], None, marks(t2=3)),
        # Marks never go back.
        (
            replace(state("a", t1=1), done=marks(t0=9)),
            replace(state("a", t1=2), done=marks(t0=9)),
            [(MAIN, 4)],
            None,
            marks(t0=9),
        ),
    ],
)
def test_done_marks_follow_what_a_change_finished(
    before: GroupState | None,
    after: GroupState,
    finished: list[tuple[int, int]],
    landed: dict[int, int] | None,
    done: tuple[int, ...],
) -> None:
    marked = groups.marked(before, after, finished, landed)
    assert marked is not None
    assert marked.done == done
    assert replace(marked, done=after.done) == after


def test_a_healed_group_has_no_marks_to_keep() -> None:
    assert groups.marked(state("a", t1=1), None, [(1, 3)]) is None
