"""How fast a worker's subscriptions commit their offsets to Kafka (docs/delivery.md, "Many
subscriptions at once").

Each subscription keeps its offsets in a consumer group of its own (decision 0011), and each
commit is two requests to Kafka: the group's coordinator is looked up first, because the
client library keeps only about ten coordinators in its cache and a worker commits for a
thousand groups. A thousand subscriptions that each delivered a message asked for about 600
requests a second for ten seconds, and the broker spent more than half a core on them while
the same two cores were delivering. Committing is bookkeeping, not delivery: an outcome is in
Redis before its commit (delivery/commits.py, "flush, then commit"), so a later commit only
means more of the log is read again, and skipped, after a takeover.

:class:`CommitPace` lets at most ``per_s`` commits a second start once ``burst`` have (a token
bucket), in the order they asked: with few subscriptions nothing waits; with many, each
subscription's commits come further apart (a thousand of them at 100 a second: one every ten
seconds), and none waits longer than the others.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable

# A worker's commits a second once its burst is used, unless SETU_DELIVERY_COMMITS_PER_SECOND
# says otherwise; and how many may start at once before that.
COMMITS_PER_S = 100.0
COMMIT_BURST = 100


class CommitPace:
    """See the module doc. Made on the event loop that awaits :meth:`turn`."""

    def __init__(
        self,
        per_s: float = COMMITS_PER_S,
        burst: int = COMMIT_BURST,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if per_s <= 0 or burst < 1:
            raise ValueError("a commit pace needs a positive rate and a burst of at least 1")
        self._per_s = per_s
        self._burst = float(burst)
        self._tokens = float(burst)
        self._clock = clock
        self._at = clock()
        self._waiting: deque[asyncio.Future[None]] = deque()
        self._timer: asyncio.TimerHandle | None = None

    @property
    def waiting(self) -> int:
        """Commits waiting for their turn (read by the worker's metrics from their thread:
        one that was cancelled counts until the next turn)."""
        return len(self._waiting)

    async def turn(self) -> None:
        """Returns when this commit may start: at once while the bucket holds a token and
        nobody waits, else after those who asked before. Cancelled, it leaves its place."""
        self._refill()
        if not self._waiting and self._tokens >= 1:
            self._tokens -= 1
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append(future)
        self._arm()
        await future

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(self._burst, self._tokens + (now - self._at) * self._per_s)
        self._at = now

    def _arm(self) -> None:
        if self._timer is None:
            delay = max(0.0, (1.0 - self._tokens) / self._per_s)
            self._timer = asyncio.get_running_loop().call_later(delay, self._serve)

    def _serve(self) -> None:
        """The timer: lets as many waiting commits go, in order, as tokens came."""
        self._timer = None
        self._refill()
        waiting = self._waiting
        while waiting and self._tokens >= 1:
            future = waiting.popleft()
            if not future.done():  # else cancelled while waiting: its place is skipped
                future.set_result(None)
                self._tokens -= 1
        while waiting and waiting[0].done():
            waiting.popleft()
        if waiting:
            self._arm()
