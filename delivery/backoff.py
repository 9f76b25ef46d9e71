"""When a retried message is next due.

A message moved to a retry tier waits that tier's delay plus jitter (a random share of the
delay, so a burst of failures does not come back as a burst), or longer when the server sent
``Retry-After``. ``Retry-After`` is capped: a tier partition is consumed in order, so one huge
value would hold back every message behind it.
"""

from __future__ import annotations

DEFAULT_JITTER = 0.1
# One hour: longer waits belong in a slower tier, not in one message's header.
MAX_RETRY_AFTER_MS = 3_600_000


def next_attempt_at(
    now_ms: int,
    delay_ms: int,
    *,
    rnd: float,
    jitter: float = DEFAULT_JITTER,
    retry_after_ms: int | None = None,
    max_retry_after_ms: int = MAX_RETRY_AFTER_MS,
) -> int:
    """The wall-clock ms when the next attempt is due.

    ``rnd`` is a uniform random number in [0, 1) supplied by the caller, so the function stays
    pure: the jitter added is ``floor(delay_ms * jitter * rnd)``.
    """
    if not 0.0 <= rnd < 1.0:
        raise ValueError("rnd must be in [0, 1)")
    wait = delay_ms + int(delay_ms * jitter * rnd)
    if retry_after_ms is not None:
        wait = max(wait, min(retry_after_ms, max_retry_after_ms))
    return now_ms + wait
