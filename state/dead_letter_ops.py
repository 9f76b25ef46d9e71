"""An operator's dead-letter use cases: browse a subscription's live dead letters and release
them (unsideline), over two ports: the subscription's :class:`state.groups.GroupStore` and a
:class:`DeadLetterLog` that reads its DLQ. The API parses requests and answers with what these
return; the rules (which letter is live, which a request selects) are the ordering model's
(:mod:`setu.ordering.dead_letters`).

A release is a request, not an act: :meth:`GroupStore.request_release` records it per
partition, and the worker owning the partition carries it out (one writer per group), so a
parked group is delivered again as a whole and in order.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from setu.ordering.dead_letters import (
    MAX_SCAN,
    DeadLetter,
    Releases,
    Selector,
    choose,
    is_live,
    parse_cursor,
)
from setu.ordering.records import Record
from setu.ordering.state import GroupState
from setu.partitioner import partition_for
from state.groups import GroupStore

# Records read from one partition per DLQ read.
READ_BUDGET = 1000


class DeadLetterLog(Protocol):
    """A subscription's DLQ, read outside its consumer group."""

    async def read(self, partition: int, start: int, budget: int) -> tuple[list[Record], int, bool]:
        """Up to ``budget`` dead letters of one partition from ``start``: the records (what is
        not a Setu record left out), the offset to go on from, and whether the end came."""
        ...


@dataclass(frozen=True, slots=True)
class Page:
    """Live dead letters with their groups' states, and the cursor of the next page."""

    letters: list[tuple[DeadLetter, GroupState | None]]
    next_cursor: str | None


class DeadLetterOps:
    """The use cases of one subscription with ``partitions`` partitions."""

    def __init__(self, store: GroupStore, log: DeadLetterLog, partitions: int) -> None:
        self._store = store
        self._log = log
        self._partitions = partitions

    async def browse(self, group_id: str | None, limit: int, after: str | None) -> Page:
        """Live dead letters, oldest first per partition, from cursor ``after``; only those of
        ``group_id`` when given (one partition then). Reads at most ``MAX_SCAN`` records: a
        page may hold fewer than ``limit`` letters and still have a next cursor. Raises
        ValueError for a bad cursor."""
        first, start = parse_cursor(after)
        if group_id is not None:
            order = [partition_for(group_id.encode(), self._partitions)]
        else:
            order = list(range(self._partitions))
        out: list[tuple[DeadLetter, GroupState | None]] = []
        scanned = 0
        for partition in (p for p in order if p >= first):
            position = start if partition == first else 0
            while len(out) < limit and scanned < MAX_SCAN:
                budget = min(READ_BUDGET, MAX_SCAN - scanned)
                letters, position, end = await self._live(
                    partition,
                    position,
                    budget,
                    lambda letter: group_id is None or letter.record.group == group_id,
                )
                scanned += READ_BUDGET
                out.extend(letters[: limit - len(out)])
                if end:
                    break
            if len(out) >= limit:
                return Page(out, out[-1][0].cursor)
            if scanned >= MAX_SCAN:
                return Page(out, f"{partition}:{max(position - 1, 0)}")
        return Page(out, None)

    async def release(self, selector: Selector) -> Releases:
        """Asks the workers to deliver the letters ``selector`` picks again (the whole parked
        group of a picked group's letter, in order); returns what was asked."""
        groups = selector.group_ids
        names = sorted(groups) if groups is not None else await self._store.failed_groups()
        states = await self._store.states_of(names)
        partition_of = {g: partition_for(g.encode(), self._partitions) for g in states}
        if groups is not None:
            scan = sorted({partition_for(g.encode(), self._partitions) for g in groups})
        else:
            scan = list(range(self._partitions))
        letters: list[DeadLetter] = []
        for partition in scan:
            position, end = 0, False
            while not end:
                found, position, end = await self._live(
                    partition, position, 5 * READ_BUDGET, lambda _: True
                )
                letters.extend(letter for letter, _ in found)
        releases = choose(letters, states, partition_of, selector)
        for partition in sorted(set(releases.groups) | set(releases.letters)):
            await self._store.request_release(
                partition, releases.groups.get(partition, ()), releases.letters.get(partition, ())
            )
        return releases

    async def _live(
        self,
        partition: int,
        start: int,
        budget: int,
        keep: Callable[[DeadLetter], bool],
    ) -> tuple[list[tuple[DeadLetter, GroupState | None]], int, bool]:
        """Live dead letters of one partition from ``start`` (:func:`is_live`), each with its
        group's state, reading at most ``budget`` records; with the offset to go on from and
        whether the end was reached."""
        records, position, end = await self._log.read(partition, start, budget)
        letters = [DeadLetter(partition, record) for record in records]
        done = await self._store.redelivered(partition)
        fences = await self._store.fences(partition)
        states = await self._store.states_of(
            letter.record.group
            for letter in letters
            if not letter.single and letter.record.group is not None
        )
        live = []
        for letter in letters:
            state = states.get(letter.record.group or "")
            if is_live(letter, state, done, fences) and keep(letter):
                live.append((letter, state))
        return live, position, end
