"""The control-plane records: projects, topics and subscriptions, as frozen dataclasses.

The metadata store persists them, the API validates and shows them, the delivery workers run
them. Defaults are those of docs/design.md §5.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

DEFAULT_RETRY_DELAYS_MS: tuple[int, ...] = (5_000, 60_000, 600_000)
# 408, 425, 429 and every 5xx are retried unless a subscription says otherwise (docs/design.md §3).
DEFAULT_RETRYABLE_CODES: tuple[int, ...] = (408, 425, 429, *range(500, 600))


class SubscriptionState(StrEnum):
    RUNNING = "running"
    PAUSED = "paused"
    STOPPED = "stopped"


class DeadLetterPolicy(StrEnum):
    PARK = "park"
    SKIP = "skip"


@dataclass(frozen=True, slots=True)
class Project:
    name: str
    description: str = ""
    created_at_ms: int = 0


@dataclass(frozen=True, slots=True)
class Topic:
    project: str
    name: str
    grouped: bool = False
    partitions: int = 6
    retention_hours: int = 168
    created_at_ms: int = 0


@dataclass(frozen=True, slots=True)
class Endpoint:
    url: str
    method: str = "POST"
    headers: tuple[tuple[str, str], ...] = ()
    timeout_ms: int = 10_000


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    delays_ms: tuple[int, ...] = DEFAULT_RETRY_DELAYS_MS
    retryable_codes: tuple[int, ...] | None = None

    @property
    def tiers(self) -> int:
        return len(self.delays_ms)

    def is_retryable(self, status: int) -> bool:
        codes = self.retryable_codes
        return status in (DEFAULT_RETRYABLE_CODES if codes is None else codes)


@dataclass(frozen=True, slots=True)
class Subscription:
    project: str
    name: str
    topic: str
    endpoint: Endpoint
    grouped: bool = False
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    dead_letter_policy: DeadLetterPolicy = DeadLetterPolicy.PARK
    max_in_flight: int = 256
    rate_limit_per_second: float | None = None
    signing_secret: str | None = None
    state: SubscriptionState = SubscriptionState.RUNNING
    version: int = 1
    # Bumped by `seek`; workers reset the main offset when they see a new value.
    seek_to_ms: int | None = None
    seek_generation: int = 0
    created_at_ms: int = 0
