"""A failed group's state and the writes that change it: the ordering model's data
(docs/design.md §4). Pure: how it is stored is the adapters' business (``state/groups.py`` keeps
it in Redis, ``state/groups_stub.py`` in memory, both behind :class:`state.groups.GroupStore`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from setu.ordering.tiers import DLQ

EMPTY_COUNTS: tuple[int, ...] = (0,) * (DLQ + 1)
# No record of the group known finished in any tier (see GroupState.done).
NOTHING_DONE: tuple[int, ...] = (-1,) * (DLQ + 1)


class StaleGroupState(Exception):
    """Raised when a group's stored version is not the one the writer expected."""


class StateLost(Exception):
    """Raised when Redis no longer holds what this owner wrote to it: it came back empty, from
    an older snapshot, or as a replica without the latest writes (docs/design.md §4, "Redis
    may forget"). The partitions are taken over again and rebuilt from the changelog."""

    def __init__(self, partitions: Sequence[int], message: str) -> None:
        super().__init__(message)
        self.partitions = tuple(partitions)


class Fenced(Exception):
    """Raised when a write names an owner epoch that is no longer its partition's epoch."""

    def __init__(self, partitions: Sequence[int], message: str) -> None:
        super().__init__(message)
        self.partitions = tuple(partitions)


@dataclass(frozen=True, slots=True)
class GroupState:
    """One failed group. ``counts[t]`` is how many of its messages are unfinished in tier t.

    ``head`` is the head's message id, or None for "the first one reached in the head tier".
    ``released``, ``dlq_from`` and ``failed_at_ms`` matter while the group is in the DLQ:
    dead letters at DLQ offsets >= ``dlq_from`` are the group's, and ``released`` says an
    operator asked for them to be delivered. ``lap`` is the retry tier where a released head
    that failed again is being retried (0: none); ``attempts``, ``last_status`` and
    ``reason`` describe the head's latest failure when it is newer than its dead letter's, or
    (in a retry tier) the failures of a head that waits where it is for its next attempt,
    which is due at ``due_at_ms`` (0: at once). ``version`` fences concurrent writers.

    ``done[t]`` is the highest offset in tier t at or below which every record of the group
    is finished (-1: none known). A group's records in one tier finish in offset order, so
    this mark tells a record read again after Redis forgot its outcome from one still to
    come (:func:`setu.ordering.groups.marked`, docs/decisions/0007-group-state-changelog.md).

    ``held`` is the main-log offset of the head when its record stays in the main log (-1:
    none): a message scheduled for later (docs/scheduling.md) waits there, counted in tier
    :data:`~setu.ordering.tiers.HOLD`, until ``due_at_ms``; a held head that failed with
    attempts to spare waits there too.
    """

    counts: tuple[int, ...] = EMPTY_COUNTS
    head: str | None = None
    released: bool = False
    dlq_from: int = -1
    failed_at_ms: int = 0
    version: int = 0
    lap: int = 0
    attempts: int = 0
    last_status: int | None = None
    reason: str = ""
    due_at_ms: int = 0
    done: tuple[int, ...] = NOTHING_DONE
    held: int = -1

    @property
    def head_tier(self) -> int:
        return max(t for t, n in enumerate(self.counts) if n > 0)

    @property
    def lowest_tier(self) -> int:
        return min(t for t, n in enumerate(self.counts) if n > 0)

    @property
    def parked(self) -> int:
        return sum(self.counts)

    def tier_above(self, tier: int) -> int:
        """The lowest non-empty tier above ``tier``."""
        return min(t for t, n in enumerate(self.counts) if n > 0 and t > tier)


@dataclass(frozen=True, slots=True)
class StateWrite:
    """One atomic change. ``state`` None with ``touches_group`` deletes the group (healthy)."""

    partition: int
    group: str | None = None
    touches_group: bool = False
    expected_version: int = 0
    state: GroupState | None = None
    outcomes: tuple[tuple[int, int], ...] = ()  # (tier, offset) now durable
    delivered: int = 0
    dead_lettered: int = 0
    retried: int = 0
    redelivered: tuple[int, ...] = ()  # single dead letters delivered again, or copied out
    releases_done: tuple[int, ...] = ()  # DLQ offsets no longer pending release
    release_request_done: bool = False  # the group's release request was taken up


@dataclass(slots=True)
class PartitionSnapshot:
    """What a worker loads when it is assigned a partition index."""

    states: dict[str, GroupState] = field(default_factory=dict)
    outcomes: set[tuple[int, int]] = field(default_factory=set)
    pending_releases: set[int] = field(default_factory=set)
    release_requests: set[str] = field(default_factory=set)
    seek_generation: int = 0
    fences: dict[int, dict[int, int]] = field(default_factory=dict)  # epoch -> tier -> offset
    # The owner epoch and its writes since the claim, as the store held them when the rest was
    # read ((0, -1): none recorded).
    owner: tuple[int, int] = (0, -1)


class ReleaseRequests(NamedTuple):
    """What operators asked of one partition index and its worker has still to carry out (an
    unsideline): ``groups`` to deliver again from the DLQ as a whole and in order, and single
    dead ``letters`` (DLQ offsets) to deliver again on their own."""

    groups: set[str]
    letters: set[int]
