"""The group-state changelog: what delivery keeps in Redis, written first to a compacted Kafka
topic so that a Redis that forgets costs nothing (docs/design.md §4, "Redis may forget";
docs/decisions/0007-group-state-changelog.md).

One topic per Setu topic, ``setu.{project}.{topic}.groups``, with the topic's partition count,
shared by its subscriptions (state/shared_changelog.py; decision 0014): partition i holds what
the owners of partition index i need. This module speaks of one subscription's records; the
shared topic puts the subscription's name and a NUL byte before each key. Records are keyed so
that compaction keeps the latest of each:

- ``g:{group}``: a failed group's whole :class:`GroupState` (JSON); a tombstone when it heals.
- ``owner``: the latest owner epoch of the partition and its fences (:mod:`setu.ordering.fencing`).
- ``r:{group}``: an operator asked for the group's dead letters again; a tombstone once taken up.
- ``l:{offset}``: a single dead letter ``pending`` delivery again, or ``redelivered``; a
  tombstone once retention removed it.
- ``seek``: the seek generation last applied.
- ``cleared``: the subscription was deleted; what came before is not its state any more (one
  of the same name created later starts empty, its owner epochs still rising).
- ``earlier``: how far the subscription's own changelog of the earlier layout
  (``setu.{project}.{subscription}.state``) was copied here (state/durable_groups.py).
- ``born``: the API created the subscription (api/provisioning.py): its consumer group holds
  no offsets until an ``owner`` record follows, since only an owner commits and every owner
  claims first. A takeover that finds it with no owner record after it need not ask Kafka for
  the group's offsets (docs/delivery.md, "Many subscriptions at once").

Every record carries its writer's owner epoch in the ``setu-epoch`` header. A record written
under an older epoch than an ``owner`` record before it comes from a worker that had lost the
partition (its Redis write was refused): replay ignores it.

Not in the changelog, and what losing them from Redis costs: recorded 2xx outcomes (a record
read again is delivered again, same ``webhook-id``; records of failed groups are recognised by
the groups' done marks instead), the lifetime counters of ``GET …/status`` (they start again),
the unhealthy index's times (rebuilt from each group's first failure).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import orjson

from setu.ordering.state import GroupState, StateWrite

OWNER = b"owner"
SEEK = b"seek"
CLEARED = b"cleared"
EARLIER = b"earlier"
BORN = b"born"
H_EPOCH = "setu-epoch"
# On a record of the shared changelog written to a subscription's own changelog too, for
# workers of the earlier version (state/shared_changelog.py).
H_MIRRORED = "setu-mirrored"
PENDING = "pending"
REDELIVERED = "redelivered"


def group_key(group: str) -> bytes:
    return b"g:" + group.encode()


def release_key(group: str) -> bytes:
    return b"r:" + group.encode()


def letter_key(offset: int) -> bytes:
    return b"l:%d" % offset


@dataclass(frozen=True, slots=True)
class ChangelogRecord:
    """One record to write: ``value`` None is a tombstone."""

    key: bytes
    value: bytes | None
    # The writer's owner epoch; None for an operator's request written by the API, which
    # owns nothing and is never stale.
    epoch: int | None

    def headers(self) -> list[tuple[str, bytes]]:
        return [] if self.epoch is None else [(H_EPOCH, str(self.epoch).encode())]


@dataclass(frozen=True, slots=True)
class Entry:
    """One record read back, at ``offset``; ``epoch`` None when it carries none. ``mirrored``:
    a record of the shared changelog written to a subscription's own one too
    (state/shared_changelog.py)."""

    key: bytes
    value: bytes | None
    epoch: int | None
    offset: int
    mirrored: bool = False


class ChangelogIO(Protocol):
    """Where one subscription's changelog lives (Kafka; a list in unit tests)."""

    async def append(self, partition: int, records: Sequence[ChangelogRecord]) -> None:
        """Writes ``records`` in order to ``partition``; returns once all are acknowledged
        by every in-sync replica, else raises."""

    async def replay(self, partition: int) -> PartitionReplay:
        """What ``partition`` says, every record from its beginning to its end as it was when
        this call began fed in log order; the caller's own copy."""

    async def copy_earlier(self, partition: int, copied_to: int) -> bool:
        """Copies the records of the subscription's own changelog of the earlier layout from
        offset ``copied_to`` to its end into ``partition``, then an ``earlier`` record of
        that end; False when there is nothing to copy (no such changelog, or nothing new)."""


def encode_state(state: GroupState) -> bytes:
    return orjson.dumps(
        {
            "v": state.version,
            "counts": state.counts,
            "head": state.head,
            "released": state.released,
            "dlq_from": state.dlq_from,
            "failed_at": state.failed_at_ms,
            "lap": state.lap,
            "attempts": state.attempts,
            "status": state.last_status,
            "reason": state.reason,
            "due": state.due_at_ms,
            "done": state.done,
            "held": state.held,
        }
    )


def decode_state(value: bytes) -> GroupState:
    raw = orjson.loads(value)
    return GroupState(
        counts=tuple(raw["counts"]),
        head=raw["head"],
        released=raw["released"],
        dlq_from=raw["dlq_from"],
        failed_at_ms=raw["failed_at"],
        version=raw["v"],
        lap=raw["lap"],
        attempts=raw["attempts"],
        last_status=raw["status"],
        reason=raw["reason"],
        due_at_ms=raw["due"],
        done=tuple(raw["done"]),
        held=raw.get("held", -1),
    )


def group_record(group: str, state: GroupState | None, epoch: int) -> ChangelogRecord:
    return ChangelogRecord(group_key(group), None if state is None else encode_state(state), epoch)


def owner_record(epoch: int, fences: Mapping[int, Mapping[int, int]]) -> ChangelogRecord:
    value = {
        "epoch": epoch,
        "fences": {str(e): {str(t): o for t, o in f.items()} for e, f in fences.items()},
    }
    return ChangelogRecord(OWNER, orjson.dumps(value), epoch)


def release_record(group: str, requested: bool, epoch: int | None) -> ChangelogRecord:
    return ChangelogRecord(release_key(group), b"1" if requested else None, epoch)


def letter_record(offset: int, status: str | None, epoch: int | None) -> ChangelogRecord:
    return ChangelogRecord(letter_key(offset), None if status is None else status.encode(), epoch)


def seek_record(generation: int, epoch: int) -> ChangelogRecord:
    return ChangelogRecord(SEEK, str(generation).encode(), epoch)


def cleared_record() -> ChangelogRecord:
    return ChangelogRecord(CLEARED, b"1", None)


def born_record() -> ChangelogRecord:
    return ChangelogRecord(BORN, b"1", None)


def earlier_record(end: int) -> ChangelogRecord:
    return ChangelogRecord(EARLIER, str(end).encode(), None)


def records_of(write: StateWrite, epoch: int) -> list[ChangelogRecord]:
    """What one state write changes in the changelog (all of it on the write's partition)."""
    out = []
    if write.touches_group and write.group is not None:
        out.append(group_record(write.group, write.state, epoch))
    again = set(write.redelivered)
    out += [letter_record(offset, REDELIVERED, epoch) for offset in sorted(again)]
    out += [letter_record(o, None, epoch) for o in sorted(set(write.releases_done) - again)]
    if write.release_request_done and write.group is not None:
        out.append(release_record(write.group, False, epoch))
    return out


@dataclass(slots=True)
class PartitionReplay:
    """What one partition's changelog says, built by feeding its records in log order."""

    states: dict[str, GroupState] = field(default_factory=dict)
    epoch: int = 0  # the latest owner epoch recorded
    fences: dict[int, dict[int, int]] = field(default_factory=dict)
    release_requests: set[str] = field(default_factory=set)
    pending: set[int] = field(default_factory=set)
    redelivered: set[int] = field(default_factory=set)
    seek_generation: int = 0
    started: bool = False  # an owner record was seen: the changelog is in use
    end: int = 0  # the offset after the last record fed
    # Keys whose latest record came from a worker that had lost the partition.
    stale: set[bytes] = field(default_factory=set)
    # How far the subscription's own changelog of the earlier layout was copied here.
    earlier_copied: int = 0
    born: bool = False  # a ``born`` record since the last ``cleared`` one

    @property
    def never_owned(self) -> bool:
        """Created by the API and never claimed since: its group holds no offsets."""
        return self.born and not self.started

    def feed_all(self, entries: Iterable[Entry], end: int) -> None:
        for entry in entries:
            self.feed(entry)
        self.end = max(self.end, end)

    def copy(self) -> PartitionReplay:
        """A copy the caller may change (states are frozen; the collections are new)."""
        return PartitionReplay(
            states=dict(self.states),
            epoch=self.epoch,
            fences={e: dict(f) for e, f in self.fences.items()},
            release_requests=set(self.release_requests),
            pending=set(self.pending),
            redelivered=set(self.redelivered),
            seek_generation=self.seek_generation,
            started=self.started,
            end=self.end,
            stale=set(self.stale),
            earlier_copied=self.earlier_copied,
            born=self.born,
        )

    def feed(self, entry: Entry) -> None:
        self.end = max(self.end, entry.offset + 1)
        key, value = entry.key, entry.value
        if key in (CLEARED, EARLIER, BORN):
            self._marker(key, value)
            return
        if key == OWNER:
            if value is not None:
                owner = orjson.loads(value)
                if owner["epoch"] >= self.epoch:
                    self.epoch = int(owner["epoch"])
                    self.fences = {
                        int(e): {int(t): int(o) for t, o in f.items()}
                        for e, f in owner["fences"].items()
                    }
                self.started = True
            return
        if entry.epoch is not None and entry.epoch < self.epoch:
            self.stale.add(key)
            return
        self.stale.discard(key)
        if key.startswith(b"g:"):
            self._group(key[2:].decode(), value)
        elif key.startswith(b"r:"):
            group = key[2:].decode()
            if value is None:
                self.release_requests.discard(group)
            else:
                self.release_requests.add(group)
        elif key.startswith(b"l:"):
            self._letter(int(key[2:]), value)
        elif key == SEEK and value is not None:
            self.seek_generation = max(self.seek_generation, int(value))

    def _marker(self, key: bytes, value: bytes | None) -> None:
        if value is None:
            return
        if key == CLEARED:
            self._clear()
        elif key == BORN:
            self.born = True
        else:
            self.earlier_copied = max(self.earlier_copied, int(value))

    def _clear(self) -> None:
        """The subscription was deleted: only its owner epoch stays (it keeps rising)."""
        self.states.clear()
        self.fences.clear()
        self.release_requests.clear()
        self.pending.clear()
        self.redelivered.clear()
        self.stale.clear()
        self.seek_generation = 0
        self.started = False
        self.earlier_copied = 0
        self.born = False

    def _group(self, group: str, value: bytes | None) -> None:
        if value is None:
            self.states.pop(group, None)
        else:
            self.states[group] = decode_state(value)

    def _letter(self, offset: int, value: bytes | None) -> None:
        self.pending.discard(offset)
        self.redelivered.discard(offset)
        if value == PENDING.encode():
            self.pending.add(offset)
        elif value == REDELIVERED.encode():
            self.redelivered.add(offset)

    def record_for(self, key: bytes, epoch: int) -> ChangelogRecord:
        """The record that says again, under ``epoch``, what the replay holds for ``key``
        (a key whose latest record a stale worker wrote: compaction may drop the record
        before it, so the value that counts is written once more)."""
        if key.startswith(b"g:"):
            return group_record(key[2:].decode(), self.states.get(key[2:].decode()), epoch)
        if key.startswith(b"r:"):
            group = key[2:].decode()
            return release_record(group, group in self.release_requests, epoch)
        if key.startswith(b"l:"):
            offset = int(key[2:])
            status = (
                PENDING
                if offset in self.pending
                else REDELIVERED
                if offset in self.redelivered
                else None
            )
            return letter_record(offset, status, epoch)
        return seek_record(self.seek_generation, epoch)


def seed_records(
    states: Mapping[str, GroupState],
    release_requests: Iterable[str],
    pending: Iterable[int],
    redelivered: Iterable[int],
    seek_generation: int,
    epoch: int,
) -> list[ChangelogRecord]:
    """A partition's state as Redis holds it, as changelog records: written once, when a
    partition that was delivered before the changelog existed is first taken over."""
    out = [group_record(g, s, epoch) for g, s in sorted(states.items())]
    out += [release_record(g, True, epoch) for g in sorted(release_requests)]
    out += [letter_record(o, PENDING, epoch) for o in sorted(pending)]
    out += [letter_record(o, REDELIVERED, epoch) for o in sorted(set(redelivered) - set(pending))]
    if seek_generation:
        out.append(seek_record(seek_generation, epoch))
    return out


# A record as Kafka takes it: key, value (None: a tombstone), headers.
Keyed = tuple[bytes, bytes | None, list[tuple[str, bytes]]]
Send = Callable[[str, int, Sequence[Keyed]], Awaitable[object]]


def entry_of(
    key: bytes | None,
    value: bytes | None,
    headers: Iterable[tuple[str, bytes | str | None]],
    offset: int,
) -> Entry | None:
    """A record read from Kafka as an :class:`Entry`; None for one without a key."""
    if key is None:
        return None
    epoch = None
    mirrored = False
    for name, raw in headers:
        if name == H_EPOCH and raw is not None:
            epoch = int(raw)
        elif name == H_MIRRORED:
            mirrored = True
    return Entry(key, value, epoch, offset, mirrored)
