"""Finishing the state changes a crash cut short, before a partition index is consumed again.

Every copy is written to Kafka before Redis records the change it stands for, so a crash in
between leaves a copy whose change is missing. Such a copy is still unfinished in its tier
(nothing acts on a copy before its change is recorded), so it sits at or after its tier's
committed offset; and its source is unfinished too, so the source's offset is at or after *its*
tier's committed offset and has no recorded outcome. :func:`missing_writes` finds those copies
in the tails read from the committed offsets to the end, and returns the Redis writes that
complete their changes, in the order the copies were written. Applying them before consuming
means the replayed source is skipped (its outcome is now recorded) and never copied twice.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from delivery import groups
from delivery.records import Record
from delivery.tiers import DLQ
from state.groups import GroupState, StateWrite


def missing_writes(
    partition: int,
    states: Mapping[str, GroupState],
    outcomes: set[tuple[int, int]],
    committed: Mapping[int, int],
    tail: Iterable[Record],
    now_ms: int,
) -> tuple[list[StateWrite], dict[str, GroupState]]:
    """The writes that complete cut-short changes, and the group states after them.

    ``tail`` holds the records of the retry tiers and the DLQ from their committed offsets on,
    each tier in offset order. ``outcomes`` is updated with the outcomes the writes record.
    """
    states = dict(states)
    writes: list[StateWrite] = []
    for copy in tail:
        if copy.kind is None or copy.origin is None:
            continue
        tier, offset = copy.origin
        if offset < committed.get(tier, -1) or (tier, offset) in outcomes:
            continue
        group = copy.group
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
            )
            if new is None:
                states.pop(group, None)
            else:
                states[group] = new
            write = StateWrite(
                partition,
                group,
                touches_group=True,
                expected_version=state.version if state is not None else 0,
                state=new,
                outcomes=((tier, offset),),
                retried=retried,
                dead_lettered=dead,
            )
        else:
            write = StateWrite(
                partition, group, outcomes=((tier, offset),), retried=retried, dead_lettered=dead
            )
        outcomes.add((tier, offset))
        writes.append(write)
    return writes, states
