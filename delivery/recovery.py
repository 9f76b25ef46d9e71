"""Finishing the state changes a crash cut short, before a partition index is consumed again.

Every copy is written to Kafka before Redis records the change it stands for, so a crash in
between leaves a copy whose change is missing. Such a copy is still unfinished in its tier
(nothing acts on a copy before its change is recorded), so it sits at or after its tier's
committed offset; and its source is unfinished too, so the source's offset is at or after *its*
tier's committed offset and has no recorded outcome. :func:`missing_writes` finds those copies
in the tails read from the committed offsets to the end, and returns the Redis writes that
complete their changes, in the order the copies were written. Applying them before consuming
means the replayed source is skipped (its outcome is now recorded) and never copied twice.

Copies made from a dead letter delivered again are the exception: the DLQ is read again below
its committed offset, so the source's offset says nothing. A single letter's copy still needs
its change while the letter is pending release; a lap's first copy while the group's state
could still start that lap (:func:`setu.ordering.groups.lap_pending`) and the copy itself has no
recorded outcome (a copy of an earlier lap of a group released again looks pending too).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from setu.ordering import groups
from setu.ordering.fencing import is_stale_copy
from setu.ordering.records import Record
from setu.ordering.state import GroupState, StateWrite
from setu.ordering.tiers import DLQ


def missing_writes(
    partition: int,
    states: Mapping[str, GroupState],
    outcomes: set[tuple[int, int]],
    committed: Mapping[int, int],
    tail: Iterable[Record],
    now_ms: int,
    pending: set[int] | None = None,
    fences: Mapping[int, Mapping[int, int]] | None = None,
) -> tuple[list[StateWrite], dict[str, GroupState]]:
    """The writes that complete cut-short changes, and the group states after them.

    ``tail`` holds the records of the retry tiers and the DLQ from their committed offsets on,
    each tier in offset order. ``outcomes`` is updated with the outcomes the writes record,
    ``pending`` (the single dead letters pending release) loses the letters they finish.
    Copies of a worker that had lost the partition (``fences``) are left alone.
    """
    states = dict(states)
    pending = pending if pending is not None else set()
    writes: list[StateWrite] = []
    for copy in tail:
        if copy.kind is None or copy.origin is None:
            continue
        if _recorded(copy, copy.kind, copy.origin, states, outcomes, committed, pending, fences):
            continue
        tier, offset = copy.origin
        group = copy.group
        again: tuple[int, ...] = ()
        if tier == DLQ and not copy.kind.ordered:
            pending.discard(offset)
            again = (offset,)
        retried = 0 if copy.tier == DLQ else 1
        dead = 1 - retried
        if copy.kind.changes_state and group is not None:
            state = states.get(group)
            new = groups.apply_copy(
                state,
                copy.kind,
                tier,
                copy.tier,
                copy.message_id,
                copy_offset=copy.offset,
                source_offset=offset,
                now_ms=now_ms,
                attempts=copy.envelope.attempt,
                status=copy.envelope.last_status,
                reason=copy.envelope.failure_reason or "",
            )
            if new is None:
                states.pop(group, None)
            else:
                states[group] = new
            lap_start = tier == DLQ and copy.kind is groups.Kind.LAP
            write = StateWrite(
                partition,
                group,
                touches_group=True,
                expected_version=state.version if state is not None else 0,
                state=new,
                outcomes=() if lap_start else ((tier, offset),),
                retried=retried,
                dead_lettered=dead,
            )
            if lap_start:
                writes.append(write)
                continue
        else:
            write = StateWrite(
                partition,
                group,
                outcomes=((tier, offset),),
                retried=retried,
                dead_lettered=dead,
                releases_done=again,
                redelivered=again,
            )
        outcomes.add((tier, offset))
        writes.append(write)
    return writes, states


def _recorded(
    copy: Record,
    kind: groups.Kind,
    origin: tuple[int, int],
    states: Mapping[str, GroupState],
    outcomes: set[tuple[int, int]],
    committed: Mapping[int, int],
    pending: set[int],
    fences: Mapping[int, Mapping[int, int]] | None,
) -> bool:
    """Whether the change ``copy`` stands for is recorded already, or is not this owner's."""
    if is_stale_copy(fences or {}, copy.tier, copy.offset, copy.epoch):
        return True
    if (copy.tier, copy.offset) in outcomes:
        return True  # acted on, so its change was recorded first (an earlier lap's copy, say)
    tier, offset = origin
    if tier == DLQ and kind is groups.Kind.LAP:
        return not groups.lap_pending(states.get(copy.group or ""), copy.message_id, offset)
    if tier == DLQ and not kind.ordered:
        return offset not in pending
    return offset < committed.get(tier, -1) or (tier, offset) in outcomes
