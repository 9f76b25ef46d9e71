"""How the operator endpoints show a group's state (docs/design.md §5: these five fields, and
whether Redis holds the group's partition in full, §4)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from api.operations import group_view
from setu.ordering.state import EMPTY_COUNTS, GroupState
from setu.ordering.tiers import DLQ


def counts(**by_tier: int) -> tuple[int, ...]:
    c = list(EMPTY_COUNTS)
    for name, n in by_tier.items():
        c[DLQ if name == "dlq" else int(name[1:])] = n
    return tuple(c)


PARKED = GroupState(counts=counts(dlq=3), head="m-1", dlq_from=7)


@pytest.mark.parametrize(
    ("state", "view"),
    [
        (None, ("healthy", None, 0, None)),
        (GroupState(counts=counts(t2=2), head="m-1"), ("retrying", "rq.2", 2, "m-1")),
        (PARKED, ("dead_lettered", "dlq", 3, "m-1")),
        (replace(PARKED, released=True, head=None), ("dead_lettered", "dlq", 3, None)),
        # A released head that failed again, on its lap through rq.1
        (replace(PARKED, lap=1), ("retrying", "rq.1", 3, "m-1")),
        # A head scheduled for later, waiting in the main log, one message parked behind it
        (
            GroupState(counts=counts(t1=2), head="m-1", held=40, due_at_ms=5_000),
            ("scheduled", None, 2, "m-1"),
        ),
        # The same head after its first call failed: it is retried where it is
        (
            GroupState(counts=counts(t1=2), head="m-1", held=40, due_at_ms=9_000, attempts=1),
            ("retrying", "rq.1", 2, "m-1"),
        ),
    ],
)
def test_group_views(state: GroupState | None, view: tuple[object, ...]) -> None:
    shown = group_view("g", state)
    assert list(shown) == [
        "group_id",
        "state",
        "tier",
        "parked",
        "head_message_id",
        "due_at_ms",
        "group_state",
    ]
    assert (shown["state"], shown["tier"], shown["parked"], shown["head_message_id"]) == view
    assert shown["due_at_ms"] == (state.due_at_ms or None if state is not None else None)
    assert shown["group_state"] == "ok"


def test_a_group_view_says_when_its_partition_is_being_rebuilt() -> None:
    # Given Redis forgot the group's partition and no worker has rebuilt it yet
    # When the group is shown
    shown = group_view("g", None, "rebuilding")
    # Then "healthy" comes with the warning that it may be out of date
    assert (shown["state"], shown["group_state"]) == ("healthy", "rebuilding")
