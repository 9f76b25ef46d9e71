"""What one webhook call's answer means (docs/design.md §3, "Delivery outcome").

2xx is delivered. 408, 425, 429, 5xx, a timeout and a connection error are retried, unless the
subscription lists its own retryable codes. Every other answer (3xx, other 4xx, 1xx) is
dead-lettered at once: redirects are not followed. ``Retry-After`` (seconds or an HTTP date) is
kept on retryable answers so the next attempt waits at least that long.
"""

from __future__ import annotations

from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from enum import StrEnum

from setu.limits import MAX_FAILURE_REASON_CHARS
from setu.model import RetryPolicy


class Verdict(StrEnum):
    DELIVERED = "delivered"
    RETRY = "retry"
    DEAD_LETTER = "dead_letter"


@dataclass(frozen=True, slots=True)
class Outcome:
    """The meaning of one attempt: a verdict, what was seen, and how long the server asked to
    wait (``retry_after_ms``, only on retries)."""

    verdict: Verdict
    status: int | None = None
    error: str | None = None
    retry_after_ms: int | None = None
    # Refused before anything was sent: an address the SSRF rule forbids, or an unsafe request.
    refused: bool = False
    # The start of a failed answer's body, as text (the attempt log, delivery/attempts.py).
    excerpt: str | None = None
    # Failed while the circuit breaker was open: the attempt is not counted and the message
    # is called again with the same attempt number (delivery/breaker.py).
    given_back: bool = False

    @property
    def reason(self) -> str:
        """A short human line for the dead-letter record: ``status 503`` or the error (cut to
        fit the header allowance of :mod:`setu.limits`)."""
        if self.status is not None:
            return f"status {self.status}"
        return (self.error or "unknown")[:MAX_FAILURE_REASON_CHARS]


def parse_retry_after(value: str | None, now_ms: int) -> int | None:
    """Milliseconds to wait from a ``Retry-After`` value (delta seconds or HTTP date); None when
    absent or unreadable. A date in the past means no wait (0)."""
    if value is None:
        return None
    text = value.strip()
    if text.isdigit():
        return int(text) * 1000
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        return None
    return max(0, int(when.timestamp() * 1000) - now_ms)


def classify_status(
    status: int, policy: RetryPolicy, retry_after: str | None = None, now_ms: int = 0
) -> Outcome:
    """The outcome of an HTTP answer with ``status``."""
    if 200 <= status < 300:
        return Outcome(Verdict.DELIVERED, status=status)
    if policy.is_retryable(status):
        return Outcome(
            Verdict.RETRY, status=status, retry_after_ms=parse_retry_after(retry_after, now_ms)
        )
    return Outcome(Verdict.DEAD_LETTER, status=status)


def classify_error(error: str) -> Outcome:
    """The outcome of a call that got no answer (timeout, refused, reset): always retried."""
    return Outcome(Verdict.RETRY, error=error)
