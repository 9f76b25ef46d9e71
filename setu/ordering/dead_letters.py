"""Dead letters as operators see them: browsing a subscription's DLQ and choosing what an
unsideline request delivers again.

Browsing reads the DLQ topic with a short-lived consumer (no consumer group), partition by
partition, in offset order, showing only live letters (:func:`is_live`). The cursor ``after``
is ``"{partition}:{offset}"`` of the last letter returned.

Unsideline (:func:`choose`) never moves messages itself; it records requests that the worker
owning each partition carries out, so a group's state has one writer:

- A group parked in the DLQ (``park`` policy) is released as a whole: its dead letters are
  delivered in place, in DLQ order, which is published order (see :mod:`setu.ordering.groups`).
  Selecting any of its letters (by group id, message id, or a head that failed before the
  given time) releases the group; selecting only a later letter would break order.
- A letter dead-lettered on its own (``skip`` policy, ungrouped, or without a group) is
  delivered again on its own; letters of one group go one at a time, in DLQ order.

A released letter that fails again goes through the retry tiers again, its attempt count
going on from where it was. A single letter is copied to the first retry tier (its old letter
is finished) and, failing in the last tier, becomes a new dead letter. A group's head goes on
a lap (:mod:`setu.ordering.groups`) and, failing in the last tier, parks the group on the same
letter again, which then shows the latest attempt count, status and reason.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Mapping, Set
from dataclasses import dataclass, field

from setu.ordering.fencing import is_stale_copy
from setu.ordering.groups import releasable
from setu.ordering.records import Record
from setu.ordering.state import GroupState
from setu.ordering.tiers import DLQ

# A browse request reads at most this many records before returning a cursor.
MAX_SCAN = 50_000


@dataclass(frozen=True, slots=True)
class DeadLetter:
    partition: int
    record: Record

    @property
    def cursor(self) -> str:
        return f"{self.partition}:{self.record.offset}"

    @property
    def single(self) -> bool:
        """Dead-lettered on its own, outside any group's ordered queue."""
        return self.record.kind is None or not self.record.kind.ordered

    def view(self, state: GroupState | None = None) -> dict[str, object]:
        """The API's view; ``state`` is the group's, whose record of the head's latest failure
        (after a lap) is newer than the letter's own headers."""
        env = self.record.envelope
        failed_at, attempts, status, error = (
            env.failed_at_ms,
            env.attempt,
            env.last_status,
            env.failure_reason,
        )
        if (
            state is not None
            and not self.single
            and state.head == env.message_id
            and state.dlq_from == self.record.offset
            and state.attempts > env.attempt
        ):
            failed_at, attempts = state.failed_at_ms, state.attempts
            status, error = state.last_status, state.reason or error
        return {
            "message_id": env.message_id,
            "group_id": env.group_id,
            "partition": self.partition,
            "offset": self.record.offset,
            "cursor": self.cursor,
            "failed_at": failed_at,
            "attempts": attempts,
            "last_status": status,
            "error": error,
            "parked": not self.single,
            "headers": [[name, value] for name, value in env.headers],
            "body": base64.b64encode(env.body).decode(),
            "body_encoding": "base64",
        }


def is_live(
    letter: DeadLetter,
    state: GroupState | None,
    redelivered: Set[int],
    fences: Mapping[int, Mapping[int, int]] | None = None,
) -> bool:
    """Whether a dead letter still waits for an operator. A single letter is, until it is
    delivered again (``redelivered``); a group's letter while its group is parked in the DLQ
    from that letter or an earlier one on (``state`` is its group's). A copy written by a
    worker that had lost the partition (``fences``, see :mod:`setu.ordering.fencing`) never is."""
    record = letter.record
    if is_stale_copy(fences or {}, record.tier, record.offset, record.epoch):
        return False
    if letter.single:
        return letter.record.offset not in redelivered
    return state is not None and state.counts[DLQ] > 0 and letter.record.offset >= state.dlq_from


def parse_cursor(after: str | None) -> tuple[int, int]:
    """(partition, first offset to read) after ``after``; raises ValueError when malformed."""
    if not after:
        return 0, -1
    partition, _, offset = after.partition(":")
    if not partition.isdigit() or not offset.isdigit():
        raise ValueError(f"cursor {after!r} is not 'partition:offset'")
    return int(partition), int(offset) + 1


@dataclass(slots=True)
class Releases:
    """What one unsideline request asks each partition's worker to do."""

    groups: dict[int, set[str]] = field(default_factory=dict)  # partition -> group ids
    letters: dict[int, set[int]] = field(default_factory=dict)  # partition -> DLQ offsets
    requeued: int = 0


@dataclass(frozen=True, slots=True)
class Selector:
    """Exactly one of: group ids, message ids, or letters that failed before a time (ms)."""

    group_ids: frozenset[str] | None = None
    message_ids: frozenset[str] | None = None
    failed_before: int | None = None

    def picks(self, letter: DeadLetter) -> bool:
        env = letter.record.envelope
        if self.group_ids is not None:
            return env.group_id in self.group_ids
        if self.message_ids is not None:
            return env.message_id in self.message_ids
        assert self.failed_before is not None
        return (env.failed_at_ms or 0) < self.failed_before

    def picks_group(self, state: GroupState) -> bool:
        """Whether a group parked in the DLQ is chosen without looking at its letters."""
        return self.failed_before is not None and state.failed_at_ms < self.failed_before


def choose(
    letters: Iterable[DeadLetter],
    states: Mapping[str, GroupState],
    partition_of: Mapping[str, int],
    selector: Selector,
) -> Releases:
    """The releases an unsideline request stands for (see the module doc).

    ``letters`` are the live dead letters read, ``states`` the failed groups' states and
    ``partition_of`` their partition index.
    """
    out = Releases()
    released: set[str] = set()

    def release_group(group: str) -> None:
        state = states.get(group)
        if group in released or state is None or not releasable(state):
            return
        released.add(group)
        out.groups.setdefault(partition_of[group], set()).add(group)
        out.requeued += state.parked

    for group in sorted(selector.group_ids or ()):
        release_group(group)
    for group, state in sorted(states.items()):
        if releasable(state) and selector.picks_group(state):
            release_group(group)
    for letter in letters:
        if not selector.picks(letter):
            continue
        owner = letter.record.envelope.group_id
        if letter.single:
            offsets = out.letters.setdefault(letter.partition, set())
            if letter.record.offset not in offsets:
                offsets.add(letter.record.offset)
                out.requeued += 1
        elif owner is not None and selector.message_ids is not None:
            release_group(owner)
    return out
