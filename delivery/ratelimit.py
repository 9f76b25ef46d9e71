"""A token bucket for ``rate_limit_per_second``: how long a call must wait to keep the rate.

Pure over an explicit clock: :meth:`TokenBucket.reserve` takes the current time and returns the
wait. Reservations queue up (the bucket may go negative), so concurrent callers are spaced out
fairly instead of all waking at once.
"""

from __future__ import annotations


class TokenBucket:
    """``rate`` tokens per second, at most ``burst`` saved up."""

    __slots__ = ("_at", "_tokens", "burst", "rate")

    def __init__(self, rate: float, burst: float | None = None, now: float = 0.0) -> None:
        if rate <= 0:
            raise ValueError("rate must be positive")
        self.rate = rate
        self.burst = max(1.0, burst if burst is not None else rate / 10)
        self._tokens = self.burst
        self._at = now

    def reserve(self, now: float) -> float:
        """Takes one token; returns seconds to wait before using it (0 when one is ready)."""
        if now > self._at:
            self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
            self._at = now
        self._tokens -= 1.0
        return 0.0 if self._tokens >= 0 else -self._tokens / self.rate
