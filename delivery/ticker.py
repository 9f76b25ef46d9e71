"""One timer for every runner's periodic work on a worker (docs/delivery.md, "What an idle
subscription costs").

Each runner used to run each of its periodic works (commit, release poll, policy check, share
of ``max_in_flight``, report, attempt-log flush, balance) as a task of its own that slept, or
waited for records through ``asyncio.wait_for``, then did its work: about 76 event-loop steps
per idle runner per second, 1.4 ms of a core, so 500 idle runners kept a worker's loop 70 %
busy (decision 0011, "Where an idle runner's time goes"). Here one timer serves them all:

- a work's due time sits in one heap; the timer fires once for everything due within
  ``GRAIN_S`` of the earliest, so a thousand runners' ticks are a few wake-ups, not thousands;
- a work is a plain function that does at once what needs no I/O and returns a coroutine
  only when it must wait on Redis or Kafka (an unchanged report, an empty flush, a fresh
  reading's release check return None): a task is made for that coroutine alone, and a work
  never runs twice at once;
- a work that ``rests`` waits, while its owner has nothing to do and its last round did
  nothing, for records (:meth:`wake`) or ``REST_S``, whichever comes first: once per rest it
  runs, and is put back to rest as it ends (one firing a rest, not one at its interval and
  another to find its owner resting). A round that did something (a commit) is followed by
  one at its interval, so the work's last round after records is never a rest late;
- a patient work failing on Redis skips rounds for up to ``PATIENCE_S`` before its owner is
  told (:class:`Periodic`); any other failure is told at once.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

import redis.exceptions

log = logging.getLogger(__name__)

# Works due within this of each other run in one firing of the timer.
GRAIN_S = 0.025
# The longest a resting work waits for records, unless it says otherwise (Periodic.rest_ms).
REST_S = 1.0
# How long a patient work may fail on Redis before its owner gives up: a Sentinel failover
# takes seconds, and a worker whose commands wait for its pool under load recovers once the
# load passes. Failing at once turned a thousand subscriptions' takeovers into a cascade: each
# failed runner was taken over again, which loaded Redis's pool more.
PATIENCE_S = 30.0
# Redis unreachable, or too slow (a pool with no free connection in time).
REDIS_AWAY = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)

Work = Callable[[], Coroutine[Any, Any, None] | None]


class Periodic(NamedTuple):
    """Work a runner does every ``interval_ms``: ``work`` returns None when it is done, or a
    coroutine to finish what must wait on I/O."""

    interval_ms: int
    work: Work
    # While the owner has nothing to do (Owner.resting), it waits for records instead, up to
    # rest_ms (None: REST_S): work that only records make necessary.
    rests: bool = False
    rest_ms: int | None = None
    # Whether Redis being unreachable or slow skips a round instead of failing the owner, for
    # up to PATIENCE_S: bookkeeping that the next round does again. Not so for work a limit
    # rests on (the share of max_in_flight), nor for Redis found without this owner's writes
    # (StateLost: the takeover rebuilds it).
    patient: bool = True


async def at_once(work: Work) -> None:
    """Does ``work`` now, waiting for its I/O if it has any."""
    pending = work()
    if pending is not None:
        await pending


class Owner(Protocol):
    """Whose works a ticket holds (a runner)."""

    label: str

    def resting(self) -> bool:
        """Nothing to do until records arrive."""
        ...

    def fail(self, error: BaseException) -> None:
        """A work failed past what it may: the owner gives up."""
        ...


@dataclass(eq=False)
class _Entry:
    periodic: Periodic
    ticket: Ticket
    due: float = 0.0
    last: float = -1e18  # when it last ran
    task: asyncio.Task[None] | None = None
    failing_since: float | None = None
    resting: bool = False
    woken: bool = False  # records arrived: runs once whether its owner rests or not
    # Its last round had nothing to do (returned None): only then may it rest. A round that
    # did something (a commit) is followed by one more at its interval, which finds out.
    idle: bool = True


@dataclass(eq=False)
class Ticket:
    """One owner's works in the ticker."""

    owner: Owner
    entries: list[_Entry] = field(default_factory=list)
    gone: bool = False
    sleeping: bool = False  # a work of it rests (wake() has something to do)


class Ticker:
    """The worker's one timer (see the module doc). Made on the event loop."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._heap: list[tuple[float, int, _Entry]] = []
        self._seq = itertools.count()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = float("inf")
        self._firing = False

    def add(self, owner: Owner, works: list[Periodic]) -> Ticket:
        """Schedules ``owner``'s works, each first after its interval."""
        ticket = Ticket(owner)
        now = self._clock()
        for periodic in works:
            entry = _Entry(periodic, ticket, last=now)
            ticket.entries.append(entry)
            self._schedule(entry, now + periodic.interval_ms / 1000)
        return ticket

    def wake(self, ticket: Ticket) -> None:
        """Records arrived for ``ticket``'s owner: its resting works are due now."""
        if not ticket.sleeping or ticket.gone:
            return
        ticket.sleeping = False
        now = self._clock()
        for entry in ticket.entries:
            if entry.resting and entry.task is None:
                entry.resting, entry.woken = False, True
                self._schedule(entry, now)

    async def remove(self, ticket: Ticket) -> None:
        """Stops ``ticket``'s works and waits until those running have ended."""
        ticket.gone = True
        await cancel_all([e.task for e in ticket.entries if e.task is not None])

    def _schedule(self, entry: _Entry, due: float) -> None:
        entry.due = due
        heapq.heappush(self._heap, (due, next(self._seq), entry))
        if due < self._timer_at and not self._firing:
            self._arm(due)

    def _arm(self, at: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        loop = asyncio.get_running_loop()
        # On the loop's own clock; the heap keeps the ticker's.
        self._timer_at = at
        self._timer = loop.call_at(loop.time() + max(0.0, at - self._clock()), self._fire)

    def _fire(self) -> None:
        self._timer, self._timer_at = None, float("inf")
        heap = self._heap
        now = self._clock()
        horizon = now + GRAIN_S
        due_now: list[tuple[float, _Entry]] = []
        while heap and heap[0][0] <= horizon:
            due, _, entry = heapq.heappop(heap)
            due_now.append((due, entry))
        self._firing = True
        try:
            for due, entry in due_now:
                # Else rescheduled since (or run already), its owner left, or running.
                if entry.due == due and not entry.ticket.gone and entry.task is None:
                    self._run(entry, now)
        finally:
            self._firing = False
            if heap:
                self._arm(heap[0][0])

    def _owner_rests(self, entry: _Entry) -> bool:
        """Whether the owner rests; an owner whose ``resting`` raises is failed (its fault)."""
        try:
            return entry.ticket.owner.resting()
        except Exception as exc:
            entry.ticket.gone = True
            entry.ticket.owner.fail(exc)
            return False

    def _run(self, entry: _Entry, now: float) -> None:
        periodic, ticket = entry.periodic, entry.ticket
        rest_s = _rest_s(periodic)
        if (
            periodic.rests
            and entry.idle
            and not entry.woken
            and now - entry.last < rest_s
            and self._owner_rests(entry)
        ):
            entry.resting = ticket.sleeping = True
            self._schedule(entry, entry.last + rest_s)
            return
        if ticket.gone:  # its resting() raised
            return
        entry.resting = entry.woken = False
        entry.last = now
        try:
            pending = periodic.work()
        except Exception as exc:
            self._ended(entry, exc)
            return
        entry.idle = pending is None
        if pending is None:
            self._ended(entry, None)
            return
        # The coroutine is the task itself: one cancelled before its first step is closed
        # by the task (a wrapper's would be left never awaited).
        task = asyncio.get_running_loop().create_task(pending)
        entry.task = task
        task.add_done_callback(lambda done: self._finished(entry, done))

    def _finished(self, entry: _Entry, task: asyncio.Task[None]) -> None:
        entry.task = None
        if not task.cancelled():
            self._ended(entry, task.exception())

    def _ended(self, entry: _Entry, error: BaseException | None) -> None:
        ticket, periodic = entry.ticket, entry.periodic
        if ticket.gone:
            return
        now = self._clock()
        if error is None:
            if entry.failing_since is not None:
                entry.failing_since = None
                log.info("%s: %s works again", ticket.owner.label, _name_of(periodic))
            if periodic.rests and entry.idle and self._owner_rests(entry):
                # Straight back to rest: its next round is a rest away, unless records come.
                entry.resting = ticket.sleeping = True
                self._schedule(entry, entry.last + _rest_s(periodic))
                return
        elif not periodic.patient or not isinstance(error, REDIS_AWAY):
            ticket.gone = True
            ticket.owner.fail(error)
            return
        elif entry.failing_since is None:
            entry.failing_since = now
            log.warning(
                "%s: %s failed (%r); trying again for up to %.0f s",
                ticket.owner.label,
                _name_of(periodic),
                error,
                PATIENCE_S,
            )
        elif now - entry.failing_since >= PATIENCE_S:
            ticket.gone = True
            ticket.owner.fail(error)
            return
        self._schedule(entry, now + periodic.interval_ms / 1000)


async def cancel_all(tasks: Sequence[asyncio.Task[Any]], every_s: float = 0.5) -> None:
    """Cancels ``tasks`` and waits until all ended, cancelling again those that are not: a
    library call may swallow a cancellation (Python 3.11's ``asyncio.wait_for`` can), and a
    housekeeping loop that went back to sleep would hold the runner's stop for its interval."""
    while pending := [t for t in tasks if not t.done()]:
        for task in pending:
            task.cancel()
        await asyncio.wait(pending, timeout=every_s)
    await asyncio.gather(*tasks, return_exceptions=True)


def _rest_s(periodic: Periodic) -> float:
    return REST_S if periodic.rest_ms is None else periodic.rest_ms / 1000


def _name_of(periodic: Periodic) -> str:
    """A periodic work's name for the log: its function's, or "periodic work"."""
    name = str(getattr(periodic.work, "__name__", "")).strip("_")
    return "periodic work" if name in ("", "<lambda>") else name
