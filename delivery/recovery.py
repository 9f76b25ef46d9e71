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
recorded outcome (a copy of an earlier lap of a group released again looks pending too). A lap's
later copy, moved up from a retry tier, needs its change only while the state has the lap in
that tier.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

from setu.ordering import groups
from setu.ordering.fencing import is_stale_copy
from setu.ordering.records import Record
from setu.ordering.state import GroupState, StateWrite
from setu.ordering.tiers import DLQ, MAIN, tier_name

log = logging.getLogger(__name__)


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
    tail = list(tail)
    creations = _creations(states, tail)
    states = dict(states)
    pending = pending if pending is not None else set()
    writes: list[StateWrite] = []
    for copy in tail:
        if copy.kind is None or copy.origin is None:
            continue
        if _recorded(
            copy, copy.kind, copy.origin, states, outcomes, committed, pending, fences, creations
        ):
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
            try:
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
            except ValueError as error:
                # The state cannot account for it (only after Redis forgot and a group healed
                # and failed again): the copy is left to be delivered on its own, once at
                # least (a STRAY), rather than stop the partition.
                log.warning(
                    "partition %d: copy at %s:%d left alone: %s",
                    partition,
                    tier_name(copy.tier),
                    copy.offset,
                    error,
                )
                continue
            lap_start = tier == DLQ and copy.kind is groups.Kind.LAP
            new = groups.marked(
                state, new, () if lap_start else ((tier, offset),), {copy.tier: copy.offset}
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


def _creations(states: Mapping[str, GroupState], tail: list[Record]) -> dict[str, Record]:
    """Per group without state, the one copy of it that may stand for a change not recorded:
    the copy that made the group fail (its main message's first copy), if it is the group's
    latest message in the tails and nothing else of that message is there. A group's changes
    follow one another, so only its latest can be missing, and any other copy of the group
    was made while it was failed, by a change recorded before it could heal."""
    latest: dict[str, Record] = {}
    copies_of: dict[tuple[str, int], int] = {}
    for copy in tail:
        group, main = copy.group, copy.envelope.main_offset
        if group is None or group in states or copy.kind is None or main is None:
            continue
        copies_of[(group, main)] = copies_of.get((group, main), 0) + 1
        held = latest.get(group)
        if held is None or (held.envelope.main_offset or -1) < main:
            latest[group] = copy
    return {
        group: copy
        for group, copy in latest.items()
        if copy.origin is not None
        and copy.origin[0] == MAIN
        and copy.kind in (groups.Kind.HEAD, groups.Kind.SKIP)
        and copies_of[(group, copy.envelope.main_offset or 0)] == 1
    }


def _recorded(
    copy: Record,
    kind: groups.Kind,
    origin: tuple[int, int],
    states: Mapping[str, GroupState],
    outcomes: set[tuple[int, int]],
    committed: Mapping[int, int],
    pending: set[int],
    fences: Mapping[int, Mapping[int, int]] | None,
    creations: Mapping[str, Record],
) -> bool:
    """Whether the change ``copy`` stands for is recorded already, or is not this owner's."""
    if is_stale_copy(fences or {}, copy.tier, copy.offset, copy.epoch):
        return True
    if (copy.tier, copy.offset) in outcomes:
        return True  # acted on, so its change was recorded first (an earlier lap's copy, say)
    tier, offset = origin
    if tier == DLQ and kind is groups.Kind.LAP:
        return not groups.lap_pending(states.get(copy.group or ""), copy.message_id, offset)
    if kind is groups.Kind.LAP and (
        groups.route_lap(states.get(copy.group or ""), tier, copy.message_id)
        is not groups.Route.DELIVER
    ):
        # A lap moving up from a retry tier is missing only while the state has the lap there.
        # This is an earlier lap's copy, perhaps from before the group healed and failed again,
        # in a tier the new state's done marks do not cover: taken for the lap in progress, it
        # would put the group on a lap of another message than its head.
        return True
    if tier == DLQ and not kind.ordered:
        return offset not in pending
    held = states.get(copy.group or "")
    if tier == MAIN and held is not None and held.held == offset and kind.changes_state:
        # A copy of the group's held head (docs/scheduling.md): its main offset finished when
        # it was held, so its outcome says nothing; while the state holds it there, the move
        # is not recorded.
        return False
    if offset < committed.get(tier, -1) or (tier, offset) in outcomes:
        return True
    if kind.changes_state and copy.group is not None:
        # After a rebuild from the changelog no outcome is known: the groups' done marks
        # and the kind of copy tell instead (docs/decisions/0007-group-state-changelog.md).
        state = states.get(copy.group)
        if state is None or copy.group in creations:
            # A group without state: only the copy that made it fail may be unrecorded
            # (:func:`_creations`); it is completed, at worst delivered once more.
            return creations.get(copy.group) is not copy
        if tier == MAIN and kind in (groups.Kind.HEAD, groups.Kind.SKIP):
            return True  # made while the group was healthy: before the state there is now
        # The state marks the copy's source (or the copy itself) finished: it holds the
        # change already.
        return offset <= state.done[tier] or copy.offset <= state.done[copy.tier]
    return False
