"""Setu's errors. Each maps to one HTTP status and one stable ``code``.

SetuError
├── InvalidInput            400  validation
├── Unauthorized            401  no key, or an unknown, revoked or expired one
├── Forbidden               403  a key without the right
├── NotFound                404  unknown project, topic, subscription, group
├── Conflict                409  different re-create, version mismatch, not empty
├── PayloadTooLarge         413  body over its limit
├── RateLimited             429
└── DependencyUnavailable   503  Kafka, Redis or the database did not answer
"""

from __future__ import annotations


class SetuError(Exception):
    """Raised for any failure Setu reports to a caller; carries status and code."""

    status = 500
    code = "internal"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def headers(self) -> list[tuple[str, str]]:
        """Headers the HTTP answer carries besides the error body."""
        return []


class InvalidInput(SetuError):
    """Raised when a request, a name or a header breaks a rule."""

    status = 400
    code = "invalid_input"


class Unauthorized(SetuError):
    """Raised when a request carries no valid API key."""

    status = 401
    code = "unauthorized"

    def headers(self) -> list[tuple[str, str]]:
        return [("WWW-Authenticate", "Bearer")]  # RFC 6750


class Forbidden(SetuError):
    """Raised when a valid key does not grant what a request asks."""

    status = 403
    code = "forbidden"


class NotFound(SetuError):
    """Raised when a named project, topic, subscription or group does not exist."""

    status = 404
    code = "not_found"


class Conflict(SetuError):
    """Raised when a request clashes with what exists (different re-create, stale version)."""

    status = 409
    code = "conflict"


class PayloadTooLarge(SetuError):
    """Raised when a request or message body is over its size limit."""

    status = 413
    code = "payload_too_large"


class RateLimited(SetuError):
    """Raised when a caller goes over a rate limit; says when to try again."""

    status = 429
    code = "rate_limited"

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s

    def headers(self) -> list[tuple[str, str]]:
        return [("Retry-After", str(self.retry_after_s))]


class DependencyUnavailable(SetuError):
    """Raised when Kafka, Redis or the database does not answer in time."""

    status = 503
    code = "dependency_unavailable"
