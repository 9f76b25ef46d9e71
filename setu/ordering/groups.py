"""The state of a failed group and every change to it (docs/design.md §4), as pure functions.

A healthy group has no state. A failed group's state counts, per tier, how many of its messages
sit there unfinished. The mechanism keeps one invariant, which is what makes order hold:

    *the older a message of the group, the higher (or equal) the tier it sits in.*

From it follows everything else:

- The head (the oldest unfinished message) is in the highest non-empty tier; only the head is
  ever attempted, and only once it is due.
- Every message keeps its own retry budget (docs/delivery.md): a head whose own attempts have
  not outgrown its tier (it waited there behind its group) stays there after a failure and is
  attempted again after its own backoff (:func:`head_waits`); it moves up only when they have.
- A main message of a failed group parks in the group's *lowest* non-empty tier (it is the
  newest), behind whatever is there.
- When the head fails again it moves one tier up; messages left in lower tiers are forwarded,
  when their tier's consumer reaches them, to the next non-empty tier above them (not straight
  to the head's tier, which could overtake a message forwarded earlier).
- When the head is delivered, the next head is the next unfinished message of the group in the
  highest non-empty tier (``head`` is then None: "whichever comes first there").
- Under the ``park`` policy the DLQ is the top tier: a dead-lettered head parks its group there
  and nothing is attempted until an operator releases the group, which delivers its dead
  letters in place, in order, from ``dlq_from`` on.
- A released head that fails again goes on a *lap*: its copy goes through the retry tiers
  again (``lap`` says which one holds it) while the letter itself, and every later message of
  the group, stays counted in the DLQ, unreleased. The lap's copy is the only thing of the
  group attempted. Delivered, the group is released again from the next letter on; failed in
  the last tier (or with a status that is not retried), the group parks on the same letter
  again, its latest attempt count, status and reason kept in the state. The letter never
  leaves its place in the DLQ, so the group's letters stay in published order.

Functions here only compute; the engine decides when, and the store persists the result after
the Kafka writes it describes are acknowledged.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from setu.ordering.state import EMPTY_COUNTS, GroupState
from setu.ordering.tiers import DLQ, HOLD, MAIN


class Kind(StrEnum):
    """Why a copy of a message was written to a retry tier or the DLQ."""

    HEAD = "head"  # the group's head, after a failed attempt
    PARK = "park"  # a main message parked behind its failed group
    FORWARD = "forward"  # a group message following its group to a higher tier
    SKIP = "skip"  # the group's head, dead-lettered on its own under the skip policy
    RETRY = "retry"  # a message outside group order, after a failed attempt
    DEAD = "dead"  # dead-lettered outside group order (ungrouped, or no state of its group)
    LAP = "lap"  # a released dead letter that failed again, retried through the tiers

    @property
    def ordered(self) -> bool:
        """Whether the copy belongs to its group's ordered queue (counted in group state)."""
        return self in (Kind.HEAD, Kind.PARK, Kind.FORWARD, Kind.LAP)

    @property
    def changes_state(self) -> bool:
        """Whether writing the copy changes its group's state."""
        return self is not Kind.RETRY and self is not Kind.DEAD


class Route(StrEnum):
    """What to do now with one message of a group."""

    DELIVER = "deliver"  # attempt it (a healthy group's message, or the group's head)
    WAIT = "wait"  # stay in memory behind the head
    PARK = "park"  # main message of a failed group: append to the target tier
    FORWARD = "forward"  # left behind in a lower tier: move up to the target tier
    SKIP = "skip"  # nothing to do: a parked dead letter, or one already handled
    STRAY = "stray"  # no state accounts for it: deliver it on its own (at-least-once)


def _add(counts: tuple[int, ...], tier: int, n: int) -> tuple[int, ...]:
    if counts[tier] + n < 0:
        raise ValueError(f"tier {tier} would hold {counts[tier] + n} messages")
    return (*counts[:tier], counts[tier] + n, *counts[tier + 1 :])


def _settled(state: GroupState, counts: tuple[int, ...], dlq_from: int) -> GroupState | None:
    """After the head finished: None (healthy) when nothing is left, else the state with the
    next head unknown; leaving the DLQ clears the DLQ-only fields."""
    if not any(counts):
        return None
    new = _new_head(state, counts, None)
    if new.head_tier != DLQ:
        return replace(new, released=False, dlq_from=-1)
    return replace(new, dlq_from=dlq_from)


def _new_head(state: GroupState, counts: tuple[int, ...], head: str | None) -> GroupState:
    """``state`` with new counts and head, and nothing left of the previous head's attempts."""
    return replace(
        state,
        counts=counts,
        head=head,
        lap=0,
        attempts=0,
        last_status=None,
        reason="",
        due_at_ms=0,
        held=-1,
        version=state.version + 1,
    )


def held(message_id: str, offset: int, due_at_ms: int) -> GroupState:
    """A healthy group's main message at ``offset`` is scheduled for ``due_at_ms``: it becomes
    the group's head and waits in the main log, counted in tier :data:`HOLD`; the group's later
    messages park behind it (docs/scheduling.md)."""
    counts = _add(EMPTY_COUNTS, HOLD, 1)
    return GroupState(counts=counts, head=message_id, held=offset, due_at_ms=due_at_ms, version=1)


def holding(state: GroupState | None, tier: int, offset: int) -> int:
    """The tier a record of the group at (``tier``, ``offset``) counts in: :data:`HOLD` for the
    held head, whose record stays in the main log; else ``tier``."""
    if tier == MAIN and state is not None and state.held == offset:
        return HOLD
    return tier


def route(state: GroupState | None, tier: int, message_id: str, offset: int) -> Route:
    """What to do with an ordered message of the group in ``tier`` (see the module doc). A
    record at or below the group's done mark in its tier is finished already: read again
    after Redis forgot its recorded outcome (:func:`marked`)."""
    if state is not None and offset <= state.done[tier]:
        return Route.SKIP
    if tier == MAIN:
        return Route.DELIVER if state is None else Route.PARK
    if tier == DLQ:
        if state is None or state.counts[DLQ] == 0 or offset < state.dlq_from:
            return Route.SKIP
        if not state.released:
            return Route.SKIP
        return Route.DELIVER if state.head in (None, message_id) else Route.WAIT
    if state is None or state.counts[tier] == 0:
        return Route.STRAY
    if tier < state.head_tier:
        return Route.FORWARD
    return Route.DELIVER if state.head in (None, message_id) else Route.WAIT


def marked(
    before: GroupState | None,
    after: GroupState | None,
    finished: Iterable[tuple[int, int]] = (),
    landed: Mapping[int, int] | None = None,
) -> GroupState | None:
    """``after`` (the state a change of ``before`` leads to) with its done marks moved on.

    Every (tier, offset) in ``finished`` is a record of the group the change finished; a copy
    of the group that ``landed`` at offset c of a tier where ``before`` held nothing of the
    group means every record of the group in that tier below c is finished. Both hold because
    a group's records finish in offset order within a tier: the head is the oldest unfinished
    one in its tier, and messages left behind move up in the order their tier is read. A held
    head counts in :data:`HOLD` but its record is in the main log: it is nothing of the group
    in that tier."""
    if after is None:
        return None
    done = list(after.done)
    for tier, offset in finished:
        done[tier] = max(done[tier], offset)
    for tier, first in (landed or {}).items():
        if records_in(before, tier) == 0:
            done[tier] = max(done[tier], first - 1)
    return replace(after, done=tuple(done))


def records_in(state: GroupState | None, tier: int) -> int:
    """How many of the group's records sit unfinished in ``tier`` itself: a held head counts
    in :data:`HOLD` while its record waits in the main log (docs/scheduling.md)."""
    if state is None or tier >= len(state.counts):
        return 0
    return state.counts[tier] - int(tier == HOLD and state.held >= 0)


def route_lap(state: GroupState | None, tier: int, message_id: str) -> Route:
    """What to do with a lap copy: attempt it if it is the one the group waits for, else it
    is left over from a lap that already moved on (a copy written twice across a crash)."""
    if state is not None and state.lap == tier and state.head == message_id:
        return Route.DELIVER
    return Route.SKIP


def target(state: GroupState, route_: Route, tier: int) -> int:
    """The tier a PARK or FORWARD goes to."""
    if route_ is Route.PARK:
        return state.lowest_tier
    if route_ is Route.FORWARD:
        return state.tier_above(tier)
    raise ValueError(f"{route_} has no target")


def head_failed(
    state: GroupState | None,
    from_tier: int,
    to_tier: int,
    message_id: str,
    *,
    dlq_offset: int = -1,
    now_ms: int = 0,
) -> GroupState:
    """The head (or a healthy group's main message) failed in ``from_tier`` and its copy is
    now in ``to_tier``; under ``park`` a DLQ copy at ``dlq_offset`` parks the group."""
    base = state if state is not None else GroupState()
    counts = base.counts if from_tier == MAIN else _add(base.counts, from_tier, -1)
    counts = _add(counts, to_tier, 1)
    new = _new_head(base, counts, message_id)
    dlq_from = dlq_offset if to_tier == DLQ else -1
    return replace(new, failed_at_ms=now_ms, released=False, dlq_from=dlq_from)


def parked(state: GroupState, to_tier: int, n: int = 1) -> GroupState:
    """``n`` main messages were appended to ``to_tier`` behind the group."""
    return replace(state, counts=_add(state.counts, to_tier, n), version=state.version + 1)


def forwarded(state: GroupState, from_tier: int, to_tier: int, n: int = 1) -> GroupState:
    """``n`` messages moved from ``from_tier`` up to ``to_tier``."""
    counts = _add(_add(state.counts, from_tier, -n), to_tier, n)
    return replace(state, counts=counts, version=state.version + 1)


def head_waits(state: GroupState, message_id: str, failure: Failure, due_at_ms: int) -> GroupState:
    """The head failed in its tier with attempts of its own to spare (see
    :func:`setu.ordering.tiers.after_failure`): it stays where it is, first in its tier, and is
    attempted again at ``due_at_ms``; its attempts so far are kept here, since its record in
    the tier does not carry them."""
    return _head_failed(state, message_id, failure, due_at_ms=due_at_ms)


def head_done(state: GroupState, tier: int, offset: int) -> GroupState | None:
    """The head in ``tier`` (at ``offset``) is finished: delivered, or dead-lettered on its own
    under ``skip``. The group is healthy again (None) when nothing of it is left."""
    counts = _add(state.counts, tier, -1)
    return _settled(state, counts, offset + 1 if tier == DLQ else state.dlq_from)


def releasable(state: GroupState | None) -> bool:
    """Whether an operator's release means something now: the group is parked in the DLQ,
    not released already and not on a lap."""
    return (
        state is not None
        and state.counts[DLQ] > 0
        and state.head_tier == DLQ
        and not state.released
        and state.lap == 0
    )


def released(state: GroupState) -> GroupState:
    """An operator released the group's dead letters; raises unless :func:`releasable`."""
    if not releasable(state):
        raise ValueError("only a group parked in the DLQ can be released")
    return replace(state, released=True, version=state.version + 1)


@dataclass(frozen=True, slots=True)
class Failure:
    """The latest failed attempt of a head: shown on its dead letter while the group parks."""

    attempts: int
    status: int | None = None
    reason: str = ""
    at_ms: int = 0


def reparked(state: GroupState, message_id: str, offset: int, failure: Failure) -> GroupState:
    """A released dead letter failed for good (after its lap, or at once): the group parks on
    it, where it is."""
    return _head_failed(state, message_id, failure, released=False, dlq_from=offset, lap=0)


def _head_failed(
    state: GroupState, message_id: str, failure: Failure, due_at_ms: int = 0, **changes: Any
) -> GroupState:
    """``state`` with ``message_id`` its head and ``failure`` its head's latest failure, due
    again at ``due_at_ms`` (0: not waiting in place), plus ``changes``."""
    return replace(
        state,
        head=message_id,
        attempts=failure.attempts,
        last_status=failure.status,
        reason=failure.reason,
        failed_at_ms=failure.at_ms,
        due_at_ms=due_at_ms,
        version=state.version + 1,
        **changes,
    )


def lap_pending(state: GroupState | None, message_id: str, offset: int) -> bool:
    """Whether a lap could start from the released dead letter ``message_id`` at ``offset``
    now (so a lap copy from it found after a crash still needs its state change)."""
    return (
        state is not None
        and state.released
        and state.lap == 0
        and state.counts[DLQ] > 0
        and state.head in (None, message_id)
        and offset >= state.dlq_from
    )


def lap_moved(
    state: GroupState, to_tier: int, message_id: str, offset: int, failure: Failure
) -> GroupState:
    """The lap's copy of the head (its letter at DLQ ``offset``) is now in retry tier
    ``to_tier``: started from the DLQ, or moved up one tier."""
    return _head_failed(state, message_id, failure, released=False, dlq_from=offset, lap=to_tier)


def lap_done(state: GroupState) -> GroupState | None:
    """The lap's copy was delivered: its letter is finished and the group is released again
    from the next one on (healthy when nothing is left)."""
    counts = _add(state.counts, DLQ, -1)
    return _settled(replace(state, released=True), counts, state.dlq_from + 1)


def apply_copy(
    state: GroupState | None,
    kind: Kind,
    from_tier: int,
    to_tier: int,
    message_id: str,
    *,
    copy_offset: int,
    source_offset: int,
    now_ms: int,
    attempts: int = 0,
    status: int | None = None,
    reason: str = "",
) -> GroupState | None:
    """The state change a copy of ``kind`` stands for; used both when the copy is written and
    when recovery finds a copy whose state change never reached Redis. ``attempts``,
    ``status`` and ``reason`` are the copy's (a lap records them). A copy of the held head
    leaves tier :data:`HOLD`, where it counted."""
    from_tier = holding(state, from_tier, source_offset)
    if kind is Kind.LAP:
        if state is None:
            raise ValueError("a lap needs a failed group")
        offset = source_offset if from_tier == DLQ else state.dlq_from
        return lap_moved(
            state, to_tier, message_id, offset, Failure(attempts, status, reason, now_ms)
        )
    if kind is Kind.HEAD:
        return head_failed(
            state, from_tier, to_tier, message_id, dlq_offset=copy_offset, now_ms=now_ms
        )
    if kind is Kind.PARK:
        if state is None:
            raise ValueError("a park needs a failed group")
        return parked(state, to_tier)
    if kind is Kind.FORWARD:
        if state is None:
            raise ValueError("a forward needs a failed group")
        return forwarded(state, from_tier, to_tier)
    if kind is Kind.SKIP and state is not None and from_tier != MAIN:
        return head_done(state, from_tier, source_offset)
    return state


class Standing(StrEnum):
    """Where an unhealthy group stands, as operators see it (docs/design.md §9)."""

    RETRYING = "retrying"
    DEAD_LETTERED = "dead_lettered"
    SCHEDULED = "scheduled"


def standing(state: GroupState) -> tuple[Standing, int]:
    """How a group with state stands and in which tier. A group on a lap is retrying its
    released head in that tier; a held head not yet attempted is scheduled, in the main log."""
    if state.held >= 0 and state.attempts == 0:
        return Standing.SCHEDULED, MAIN
    tier = state.lap or state.head_tier
    return (Standing.DEAD_LETTERED if tier == DLQ else Standing.RETRYING), tier
