"""``rate_limit_per_second``: a local token bucket, and the one shared by every worker.

:class:`TokenBucket` is pure over an explicit clock: :meth:`TokenBucket.reserve` takes the
current time and returns the wait. Reservations queue up (the bucket may go negative), so
concurrent callers are spaced out fairly instead of all waking at once.

:class:`SharedRate` keeps the rate for the subscription as a whole (docs/policies.md §5): the
bucket lives in Redis (state/delivery_budget.py); a worker takes one call's token and leases
:data:`LEASE_SHARE` of a second's rate with it, spent on its next calls within
:data:`LEASE_TTL_S` (then dropped, so an idle worker hoards nothing). Callers queue on a lock,
so one at a time asks Redis or waits for the bucket, in arrival order.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from state.quota_buckets import Grant

LEASE_SHARE = 0.05
LEASE_TTL_S = 0.25

Take = Callable[[float, float, int, int], Awaitable[Grant]]
"""(rate, burst, need, extra) -> the shared bucket's grant"""


def burst_of(rate: float) -> float:
    """What a bucket of ``rate`` saves up by default: a tenth of a second's worth, at least
    one call."""
    return max(1.0, rate / 10)


class TokenBucket:
    """``rate`` tokens per second, at most ``burst`` saved up."""

    __slots__ = ("_at", "_tokens", "burst", "rate")

    def __init__(self, rate: float, burst: float | None = None, now: float = 0.0) -> None:
        if rate <= 0:
            raise ValueError("rate must be positive")
        self.rate = rate
        self.burst = burst_of(rate) if burst is None else max(1.0, burst)
        self._tokens = self.burst
        self._at = now

    def reserve(self, now: float) -> float:
        """Takes one token; returns seconds to wait before using it (0 when one is ready)."""
        if now > self._at:
            self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
            self._at = now
        self._tokens -= 1.0
        return 0.0 if self._tokens >= 0 else -self._tokens / self.rate


class SharedRate:
    """``rate`` calls per second over every worker of a subscription (see the module doc)."""

    def __init__(self, take: Take, rate: float, clock: Callable[[], float] = time.monotonic):
        if rate <= 0:
            raise ValueError("rate must be positive")
        self.rate = rate
        self.burst = burst_of(rate)
        self._take = take
        self._clock = clock
        self._lease = int(rate * LEASE_SHARE)
        self._tokens = 0
        self._until = 0.0
        self._lock = asyncio.Lock()

    def _spend(self) -> bool:
        if self._tokens > 0 and self._clock() < self._until:
            self._tokens -= 1
            return True
        return False

    async def acquire(self) -> None:
        """Returns when one call may start."""
        if self._spend():
            return
        async with self._lock:
            while not self._spend():
                grant = await self._take(self.rate, self.burst, 1, self._lease)
                if grant.admitted:
                    self._tokens = grant.extra_messages
                    self._until = self._clock() + LEASE_TTL_S
                    return
                await asyncio.sleep(grant.wait_ms / 1000)
