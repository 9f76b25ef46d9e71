"""Which subscription takes which record of a shared main partition (decision 0011).

A worker reads each main partition it owns once, for every subscription of the topic. Each
subscription has a *cursor* per partition: the next offset it takes. Two readers offer records:
the *live* reader, which only goes forward, and the *catch-up* reader, which reads for cursors
behind the live one, a turn of at most ``turn_records`` records at a time, in turns. A cursor
follows one of them at a time and takes a record offered by the reader it follows when the
record's offset is at or past its next offset and it has room; the offset test is what makes
every switch between readers exact. A cursor without room stops taking and so falls behind the
live reader, which does not wait for it.

This module is the bookkeeping only, with no Kafka in it: the readers (``delivery/readers.py``)
ask it where to read and whom to hand each record to.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from enum import Enum


class Reader(Enum):
    LIVE = "live"
    CATCH_UP = "catch-up"


@dataclass(slots=True)
class Cursor:
    next: int
    room: bool = True
    follows: Reader = Reader.CATCH_UP


@dataclass(slots=True)
class Turn:
    """A catch-up turn: read from ``offset``, at most ``records`` records, for ``riders``: the
    cursors that were at or past ``offset`` when it began and have taken every record offered
    since from their own next offset on (one that missed a record, was sought or left drops
    out of the turn)."""

    offset: int
    records: int
    riders: set[str]
    # The offset the catch-up reader must offer next in this turn (see offer_catch_up).
    expect: int = 0
    # Riders that took a record in this turn: they go to the back of the round when it ends
    # (one whose next offset the turn did not reach keeps its place).
    served: set[str] = field(default_factory=set)


class PartitionCursors:
    """The cursors of one main partition on this worker, by subscription."""

    def __init__(self, turn_records: int = 2048) -> None:
        self.turn_records = turn_records
        self._cursors: dict[str, Cursor] = {}
        # The next offset the live reader offers; None until it has a place to start.
        self.live_next: int | None = None
        self._turn: Turn | None = None
        # Catch-up turns go round: the subscription served last goes to the back.
        self._served: list[str] = []
        # The partition's first offset as last asked (records below it are gone: retention),
        # and whether a gap above it waits for it to be asked again (see _gap_ends_turn).
        self.first_offset = 0
        self.asking_first = False

    # The subscriptions.

    def add(self, subscription: str, next_offset: int) -> None:
        """A subscription starts reading this partition at ``next_offset``. One that had a
        cursor here (a runner started again) leaves the catch-up turn it rode: the turn reads
        on from where that cursor was, and the new one would take those records as if the
        ones in between were taken."""
        self._leave_turn(subscription)
        self._cursors[subscription] = Cursor(next_offset)
        self._follow(subscription)

    def remove(self, subscription: str) -> None:
        self._cursors.pop(subscription, None)
        if subscription in self._served:
            self._served.remove(subscription)
        self._leave_turn(subscription)

    def seek(self, subscription: str, next_offset: int) -> None:
        """The subscription reads on from ``next_offset`` (an operator's seek, a replay of
        what it had taken but not finished after a revocation)."""
        self._cursors[subscription].next = next_offset
        self._leave_turn(subscription)
        self._follow(subscription)

    def set_room(self, subscription: str, room: bool) -> None:
        """Whether the subscription takes records now (its buffer, a pause)."""
        cursor = self._cursors.get(subscription)
        if cursor is None:
            return
        cursor.room = room
        if room:
            self._follow(subscription)

    def __contains__(self, subscription: str) -> bool:
        return subscription in self._cursors

    def next_offset(self, subscription: str) -> int:
        return self._cursors[subscription].next

    def follows(self, subscription: str) -> Reader:
        return self._cursors[subscription].follows

    def subscriptions(self) -> list[str]:
        return list(self._cursors)

    # The live reader.

    def live_start(self) -> int | None:
        """Where the live reader starts: where most cursors are (the furthest of those, on a
        tie), so that the fewest go through catch-up; None without cursors."""
        if not self._cursors:
            return None
        counts = Counter(c.next for c in self._cursors.values())
        most = max(counts.values())
        start = max(offset for offset, n in counts.items() if n == most)
        self.live_next = start
        for name in self._cursors:
            self._follow(name)
        return start

    def offer_live(self, offset: int) -> list[str]:
        """The live reader read ``offset``: the subscriptions that take it (their cursors move
        past it). A cursor without room falls behind, to the catch-up reader."""
        self.live_next = offset + 1
        takers = []
        for name, cursor in self._cursors.items():
            if cursor.follows is not Reader.LIVE:
                continue
            if offset < cursor.next:
                continue  # sought past the live reader: not there yet
            if not cursor.room:
                cursor.follows = Reader.CATCH_UP
                continue
            cursor.next = offset + 1
            takers.append(name)
        return takers

    # The catch-up reader.

    def behind(self) -> list[str]:
        """Cursors that follow the catch-up reader and have room."""
        return [
            name
            for name, cursor in self._cursors.items()
            if cursor.follows is Reader.CATCH_UP and cursor.room
        ]

    @property
    def current(self) -> Turn | None:
        """The turn being read, if any (:meth:`turn` starts the next one)."""
        return self._turn

    def turn(self) -> Turn | None:
        """The catch-up turn to read now (the current one until it ends), or None when no
        cursor needs one. A new turn serves the cursor served longest ago, and every other
        waiting cursor at or past its offset: each takes the turn's records from its own
        next offset on, so cursors a few records apart (a hundred subscriptions taken over
        at once) are served by one pass, not one seek and read each."""
        if self._turn is not None:
            return self._turn
        if self.asking_first:
            return None
        waiting = self.behind()
        if not waiting:
            return None
        order = {name: i for i, name in enumerate(self._served)}
        first = min(waiting, key=lambda name: order.get(name, -1))
        offset = self._cursors[first].next
        riders = {n for n in waiting if self._cursors[n].next >= offset}
        self._turn = Turn(offset, self.turn_records, riders, offset)
        return self._turn

    def _gap_ends_turn(self, turn: Turn, offset: int) -> bool:
        """The catch-up reader read ``offset`` (a record, or the partition's end) where the
        turn expects ``turn.expect``. Records below the partition's first offset are gone
        (retention): the turn crosses up to it. Any other gap is something read from before
        the turn's seek took (a record, or that place's end): the turn ends, its riders stay
        where they are, and no turn starts until the first offset was asked again (the hub
        does, :attr:`asking_first`); the next turn seeks afresh. A gap is never crossed on a
        guess: a main log has no holes but the prefix retention removed. True when the
        record or end is not to be taken."""
        if offset <= turn.expect:
            return False
        if turn.expect < self.first_offset:
            turn.expect = self.first_offset
            if offset <= turn.expect:
                return False
        self.asking_first = True
        self._turn = None
        return True

    def learned_first(self, first_offset: int) -> None:
        """The hub asked the partition's first offset (after a gap): turns start again."""
        self.first_offset = max(self.first_offset, first_offset)
        self.asking_first = False

    def offer_catch_up(self, offset: int) -> list[str]:
        """The catch-up reader read ``offset`` in the current turn: the riders that take it. A
        rider without room drops out of the turn (it would miss this record); one that reaches
        the live reader follows it from then on. The turn ends when its records are used up or
        no rider is left."""
        turn = self._turn
        if turn is None or offset < turn.expect:
            return []  # read before the turn's seek took
        if self._gap_ends_turn(turn, offset):
            return []
        turn.expect = offset + 1
        takers = []
        for name in list(turn.riders):
            cursor = self._cursors[name]
            if offset < cursor.next:
                continue
            if not cursor.room:
                turn.riders.discard(name)
                continue
            cursor.next = offset + 1
            takers.append(name)
            turn.served.add(name)
            self._follow(name)
        turn.records -= 1
        if turn.records <= 0 or not turn.riders:
            self._end_turn()
        return takers

    def caught_up(self, end: int) -> None:
        """The catch-up reader read everything before ``end`` (the partition's end) in the
        current turn: its riders are where the live reader is."""
        turn = self._turn
        if turn is None or self._gap_ends_turn(turn, end):
            return
        for name in list(turn.riders):
            cursor = self._cursors[name]
            cursor.next = max(cursor.next, end)
            turn.served.add(name)
            self._follow(name)
        self._end_turn()

    # Inside.

    def _follow(self, name: str) -> None:
        """The reader the cursor follows: the live one once it is not behind it (and has
        room), the catch-up one while it is."""
        cursor = self._cursors[name]
        live = self.live_next
        if live is None or cursor.next < live:
            cursor.follows = Reader.CATCH_UP
        elif cursor.room:
            cursor.follows = Reader.LIVE
            self._leave_turn(name)

    def _leave_turn(self, name: str) -> None:
        turn = self._turn
        if turn is None or name not in turn.riders:
            return
        turn.riders.discard(name)
        if not turn.riders:
            self._end_turn()

    def _end_turn(self) -> None:
        turn, self._turn = self._turn, None
        if turn is None:
            return
        # Those who rode to the end and were served go to the back of the round.
        for name in sorted(turn.riders & turn.served):
            if name in self._served:
                self._served.remove(name)
            self._served.append(name)
