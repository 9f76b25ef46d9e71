"""Dead letters as operators see them: browsing a subscription's DLQ and choosing what an
unsideline request delivers again.

Browsing reads the DLQ topic with a short-lived consumer (no consumer group), partition by
partition, in offset order, skipping letters already delivered again. The cursor ``after`` is
``"{partition}:{offset}"`` of the last letter returned.

Unsideline (:func:`choose`) never moves messages itself; it records requests that the worker
owning each partition carries out, so a group's state has one writer:

- A group parked in the DLQ (``park`` policy) is released as a whole: its dead letters are
  delivered in place, in DLQ order, which is published order (see :mod:`delivery.groups`).
  Selecting any of its letters (by group id, message id, or a head that failed before the
  given time) releases the group; selecting only a later letter would break order.
- A letter dead-lettered on its own (``skip`` policy, ungrouped, or without a group) is
  delivered again on its own; letters of one group go one at a time, in DLQ order.

A released letter that fails again is retried in place with the tier delays; if it still
fails, the group parks on it again (or the single letter stays dead).
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from delivery.records import Record
from delivery.tiers import DLQ
from state.groups import GroupState

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

    def view(self) -> dict[str, object]:
        env = self.record.envelope
        return {
            "message_id": env.message_id,
            "group_id": env.group_id,
            "partition": self.partition,
            "offset": self.record.offset,
            "cursor": self.cursor,
            "failed_at": env.failed_at_ms,
            "attempts": env.attempt,
            "last_status": env.last_status,
            "error": env.failure_reason,
            "parked": not self.single,
            "headers": [[name, value] for name, value in env.headers],
            "body": base64.b64encode(env.body).decode(),
            "body_encoding": "base64",
        }


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


def _parked_in_dlq(state: GroupState | None) -> bool:
    return state is not None and state.counts[DLQ] > 0 and state.head_tier == DLQ


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
        if group in released or state is None or not _parked_in_dlq(state) or state.released:
            return
        released.add(group)
        out.groups.setdefault(partition_of[group], set()).add(group)
        out.requeued += state.parked

    for group in sorted(selector.group_ids or ()):
        release_group(group)
    for group, state in sorted(states.items()):
        if _parked_in_dlq(state) and selector.picks_group(state):
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
