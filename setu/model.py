"""The control-plane records: projects, topics and subscriptions, as frozen dataclasses.

The metadata store persists them, the API validates and shows them, the delivery workers run
them. Defaults are those of docs/design.md §5.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import StrEnum

from setu.policies import Policies

DEFAULT_RETRY_DELAYS_MS: tuple[int, ...] = (5_000, 60_000, 600_000)
# 408, 425, 429 and every 5xx are retried unless a subscription says otherwise (docs/design.md §3).
DEFAULT_RETRYABLE_CODES: tuple[int, ...] = (408, 425, 429, *range(500, 600))


class SubscriptionState(StrEnum):
    RUNNING = "running"
    PAUSED = "paused"
    STOPPED = "stopped"


class StopMode(StrEnum):
    """How workers stop a subscription (docs/policies.md §6)."""

    GRACEFUL = "graceful"  # calls in progress finish (within the drain timeout), then commit
    FORCED = "forced"  # calls in progress are abandoned; they are made again on start


class DeadLetterPolicy(StrEnum):
    PARK = "park"
    SKIP = "skip"


@dataclass(frozen=True, slots=True)
class ProduceQuota:
    """How fast a project's producers may write, summed over every API replica; None: no
    limit of the project's own (the settings' default applies). docs/security.md §6."""

    messages_per_second: float | None = None
    bytes_per_second: float | None = None

    def or_else(self, default: ProduceQuota) -> ProduceQuota:
        """This quota, each unset rate taken from ``default``."""
        return ProduceQuota(
            self.messages_per_second
            if self.messages_per_second is not None
            else default.messages_per_second,
            self.bytes_per_second
            if self.bytes_per_second is not None
            else default.bytes_per_second,
        )


@dataclass(frozen=True, slots=True)
class Project:
    name: str
    description: str = ""
    created_at_ms: int = 0
    quota: ProduceQuota = field(default_factory=ProduceQuota)


DEFAULT_DEDUP_WINDOW_SECONDS = 300
MAX_DEDUP_WINDOW_SECONDS = 24 * 3600


@dataclass(frozen=True, slots=True)
class Topic:
    project: str
    name: str
    grouped: bool = False
    partitions: int = 6
    retention_hours: int = 168
    created_at_ms: int = 0
    dedup_window_seconds: int = DEFAULT_DEDUP_WINDOW_SECONDS
    """A message without a producer id is a duplicate of one with its message id accepted this
    long before (0: never); docs/ingest.md, "De-duplication by message id"."""


@dataclass(frozen=True, slots=True)
class EndpointTls:
    """An https endpoint's TLS beyond the defaults (docs/security.md §4, "Protected
    endpoints"), as PEM text: the client certificate and key shown for mutual TLS, and a CA
    trusted beside the system's. ``client_key`` is a secret: out of the repr, sealed at rest,
    write-only."""

    client_certificate: str | None = None
    client_key: str | None = field(default=None, repr=False)
    ca_certificate: str | None = None


@dataclass(frozen=True, slots=True)
class OAuth2Credentials:
    """OAuth2 client credentials whose tokens authorize an endpoint's calls (delivery/oauth2.py);
    ``client_secret`` is a secret: out of the repr, sealed at rest, write-only."""

    token_url: str
    client_id: str
    client_secret: str = field(repr=False)
    scopes: tuple[str, ...] = ()
    audience: str | None = None
    # How the client authenticates to the token endpoint: "basic" (HTTP Basic) or "post"
    # (client_id and client_secret in the form).
    client_auth: str = "basic"


@dataclass(frozen=True, slots=True)
class Endpoint:
    url: str
    method: str = "POST"
    # (name, value) pairs sent with every call. The values are secrets (docs/security.md §5):
    # kept out of the repr, sealed at rest, shown by name only.
    headers: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    timeout_ms: int = 10_000
    tls: EndpointTls | None = None
    oauth2: OAuth2Credentials | None = None
    # The name of the egress proxy its calls go through (SETU_EGRESS_PROXIES); None: the
    # default one (SETU_EGRESS_PROXY) if any, else none.
    proxy: str | None = None

    @property
    def header_names(self) -> list[str]:
        return [name for name, _ in self.headers]


# A subscription holds one signing secret, or two while a rotation runs (docs/security.md §5).
MAX_SIGNING_SECRETS = 2


@dataclass(frozen=True, slots=True)
class SigningSecret:
    """One signing secret of a subscription. ``value`` is write-only: never in a repr or view."""

    id: str
    value: str = field(repr=False)
    created_at_ms: int = 0
    # Set on the previous secret when a rotation starts; calls stop using it from then on.
    expires_at_ms: int | None = None

    def active(self, now_ms: int) -> bool:
        return self.expires_at_ms is None or now_ms < self.expires_at_ms


def rotate_secrets(
    held: tuple[SigningSecret, ...], new: SigningSecret, previous_until_ms: int
) -> tuple[SigningSecret, ...]:
    """The secrets after ``new`` becomes current at ``new.created_at_ms``: the current one
    stays valid until ``previous_until_ms`` (or its own earlier expiry); older ones and
    expired ones are dropped, so at most :data:`MAX_SIGNING_SECRETS` remain."""
    now = new.created_at_ms
    live = [s for s in held if s.active(now)]
    if not live:
        return (new,)
    current = live[0]
    until = min(previous_until_ms, current.expires_at_ms or previous_until_ms)
    if until <= now:
        return (new,)
    return (new, replace(current, expires_at_ms=until))


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

    def delay_ms(self, tier: int) -> int:
        """How long a message waits in retry tier ``tier`` (1..N) before its next attempt;
        a tier past the last (none: ``delays_ms`` shrank since) waits the last delay."""
        delays = self.delays_ms
        return delays[min(tier, len(delays)) - 1] if delays else 0


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
    # Newest first; see rotate_secrets.
    signing_secrets: tuple[SigningSecret, ...] = ()
    state: SubscriptionState = SubscriptionState.RUNNING
    version: int = 1
    # Bumped by `seek`; workers reset the main offset when they see a new value.
    seek_to_ms: int | None = None
    seek_generation: int = 0
    created_at_ms: int = 0
    policies: Policies = field(default_factory=lambda: Policies())
    # Why a policy paused the subscription (docs/policies.md §3); cleared by resume and start.
    paused_reason: str | None = None
    # The latest stop: how, and when it was asked for (docs/policies.md §6).
    stop_mode: StopMode = StopMode.GRACEFUL
    stop_requested_at_ms: int | None = None


# The operational events a project may be told of (docs/policies.md §4).
EVENT_TYPES: tuple[str, ...] = (
    "subscription.paused",
    "endpoint.breaker_opened",
    "endpoint.breaker_closed",
    "message.dead_lettered",
    "group.parked",
)


@dataclass(frozen=True, slots=True)
class Notifications:
    """Where a project's operational events go. ``signing_secret`` is write-only, as a
    subscription's (kept out of the repr, sealed at rest)."""

    project: str
    url: str
    events: tuple[str, ...]
    signing_secret: str | None = field(default=None, repr=False)
    updated_at_ms: int = 0
