"""Request bodies of the control plane (pydantic, strict: no silent coercion of "6" to 6, no
unknown fields) and the JSON views of the records (plain dicts, serialised with orjson).

Numeric bounds live here so the OpenAPI shows them; rules across fields are in
:mod:`api.validation`. The ``*Out`` models only document responses.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from api.endpoint_access import access_view
from api.responses import Out
from setu import names
from setu.access import ApiKey
from setu.clock import now_ms
from setu.errors import InvalidInput
from setu.model import (
    DEFAULT_DEDUP_WINDOW_SECONDS,
    DEFAULT_RETRY_DELAYS_MS,
    MAX_DEDUP_WINDOW_SECONDS,
    ProduceQuota,
    Project,
    Subscription,
    Topic,
)
from setu.policies import (
    DEFAULT_AUTO_PAUSE_AFTER_S,
    BreakerPolicy,
    DeadLetterWindow,
    Policies,
    StartFrom,
    parse_filter,
    parse_start_from,
)

MAX_PARTITIONS = 1000
MAX_RETENTION_HOURS = 10 * 365 * 24
MAX_RETRY_DELAY_MS = 7 * 24 * 3_600_000
MIN_TIMEOUT_MS = 100
MAX_TIMEOUT_MS = 120_000
MAX_IN_FLIGHT = 10_000

Name = Annotated[
    str,
    Field(min_length=1, max_length=63, pattern=names.NAME_PATTERN, examples=["orders"]),
]
Delay = Annotated[int, Field(ge=0, le=MAX_RETRY_DELAY_MS)]
StatusCode = Annotated[int, Field(ge=100, le=599)]


class Body(BaseModel):
    """A request body: no unknown fields, no type coercion, no NUL character in any text (the
    metadata store cannot keep one: PostgreSQL refused it with a 500)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    @model_validator(mode="after")
    def _no_nul(self) -> Body:
        if _holds_nul(self.model_dump()):
            raise ValueError("text fields may not contain NUL characters")
        return self


def _holds_nul(value: object) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_holds_nul(k) or _holds_nul(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(_holds_nul(v) for v in value)
    return False


class QuotaBody(Body):
    """A project's produce quota over all API replicas; a rate left out or null: the
    settings' default (docs/security.md §6)."""

    # At least one message per 100 s and one byte per second: a smaller rate would make a
    # single message wait for ages (and overflow the buckets' arithmetic).
    messages_per_second: float | None = Field(None, ge=0.01, le=10_000_000)
    bytes_per_second: float | None = Field(None, ge=1, le=100 * 2**30)

    def quota(self) -> ProduceQuota:
        return ProduceQuota(self.messages_per_second, self.bytes_per_second)


class ProjectCreate(Body):
    name: Name
    description: str = Field("", max_length=1000)
    quota: QuotaBody = Field(
        default_factory=lambda: QuotaBody(messages_per_second=None, bytes_per_second=None)
    )


class TopicCreate(Body):
    name: Name
    grouped: bool = False
    partitions: int = Field(6, ge=1, le=MAX_PARTITIONS)
    retention_hours: int = Field(168, ge=1, le=MAX_RETENTION_HOURS)
    dedup_window_seconds: int = Field(
        DEFAULT_DEDUP_WINDOW_SECONDS,
        ge=0,
        le=MAX_DEDUP_WINDOW_SECONDS,
        description="A message without a producer id whose message id was accepted this long "
        "before is dropped as a duplicate; 0 turns it off.",
    )


# The longest PEM text a subscription may hold in one field (a certificate chain, say).
MAX_PEM_CHARS = 32 * 1024
Scope = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[\x21\x23-\x5b\x5d-\x7e]+$")]


class EndpointTlsBody(Body):
    """TLS beyond the defaults (docs/security.md §4): a client certificate and its key for
    mutual TLS, and a CA trusted beside the system's (for the endpoint and the OAuth2 token
    endpoint). PEM text; ``client_key`` is write-only."""

    client_certificate: str | None = Field(None, min_length=1, max_length=MAX_PEM_CHARS)
    client_key: str | None = Field(None, min_length=1, max_length=MAX_PEM_CHARS)
    ca_certificate: str | None = Field(None, min_length=1, max_length=MAX_PEM_CHARS)


class OAuth2Body(Body):
    """OAuth2 client credentials (RFC 6749 §4.4): each call carries a bearer token from
    ``token_url`` (https). ``client_secret`` is write-only."""

    token_url: str = Field(max_length=2048, examples=["https://auth.example.com/oauth/token"])
    client_id: str = Field(min_length=1, max_length=256)
    client_secret: str = Field(min_length=1, max_length=1024)
    scopes: list[Scope] = Field(default_factory=list, max_length=32)
    audience: str | None = Field(None, min_length=1, max_length=512)
    # How the client authenticates to the token endpoint: HTTP Basic, or in the form.
    client_auth: Literal["basic", "post"] = "basic"


class EndpointBody(Body):
    url: str = Field(max_length=2048, examples=["https://hooks.example.com/orders"])
    method: Literal["POST", "PUT", "PATCH"] = "POST"
    headers: dict[str, str] = Field(default_factory=dict, max_length=64)
    timeout_ms: int = Field(10_000, ge=MIN_TIMEOUT_MS, le=MAX_TIMEOUT_MS)
    # Left out on PUT: as stored (for the same origin); null: none.
    tls: EndpointTlsBody | None = None
    oauth2: OAuth2Body | None = None
    # The name of one of the installation's egress proxies (SETU_EGRESS_PROXIES); null: the
    # default one (SETU_EGRESS_PROXY), if any.
    proxy: Name | None = None


class RetryBody(Body):
    delays_ms: list[Delay] = Field(
        default_factory=lambda: list(DEFAULT_RETRY_DELAYS_MS), max_length=names.MAX_RETRY_TIERS
    )
    # None: 408, 425, 429 and every 5xx.
    retryable_codes: list[StatusCode] | None = Field(None, max_length=500)


class BreakerBody(Body):
    """The circuit breaker's thresholds (docs/policies.md §2)."""

    # Opens when more than this share of the window's calls failed...
    failure_ratio: float = Field(0.5, gt=0, le=1)
    # ...over at least this many calls.
    min_calls: int = Field(20, ge=1, le=10_000)
    window_s: int = Field(30, ge=1, le=3600)
    # Open this long before a probe call.
    open_s: int = Field(30, ge=1, le=86_400)


class DeadLetterWindowBody(Body):
    """More than ``threshold`` of the last ``size`` messages dead-lettered pauses the
    subscription (docs/policies.md §3)."""

    size: int = Field(100, ge=1, le=10_000)
    threshold: int = Field(50, ge=0)

    @model_validator(mode="after")
    def _below_size(self) -> DeadLetterWindowBody:
        if self.threshold >= self.size:
            raise ValueError("dead_letter_window.threshold must be below size")
        return self


class SubscriptionConfig(Body):
    """What a subscription does; shared by create and update."""

    # None: as grouped as its topic.
    grouped: bool | None = None
    endpoint: EndpointBody
    retry: RetryBody = Field(default_factory=lambda: RetryBody(retryable_codes=None))
    dead_letter_policy: Literal["park", "skip"] = "park"
    max_in_flight: int = Field(256, ge=1, le=MAX_IN_FLIGHT)
    rate_limit_per_second: float | None = Field(None, gt=0, le=1_000_000)
    signing_secret: str | None = Field(None, min_length=1, max_length=512)
    # Policies (docs/design.md §10, docs/policies.md); checked by setu.policies.
    filter: dict[str, Any] | None = Field(
        None, examples=[{"header": "X_EVENT_TYPE", "in": ["order.created", "order.paid"]}]
    )
    # Left out: default thresholds; null: no breaker.
    circuit_breaker: BreakerBody | None = Field(
        default_factory=lambda: BreakerBody.model_validate({})
    )
    # null: never paused for a broken endpoint.
    auto_pause_after_s: int | None = Field(DEFAULT_AUTO_PAUSE_AFTER_S, ge=1, le=30 * 86_400)
    dead_letter_window: DeadLetterWindowBody | None = None
    # "earliest", "latest" or {"timestamp_ms": T}; left out on PUT: as it was.
    start_from: str | dict[str, int] | None = Field(None, examples=["latest"])

    def policies(self, current: Policies | None = None) -> Policies:
        """The policies this body describes; ``current`` gives the stored start (a PUT)."""
        breaker, window = self.circuit_breaker, self.dead_letter_window
        if self.start_from is None:
            start = current.start_from if current is not None else StartFrom()
        else:
            start = parse_start_from(self.start_from)
            if current is not None and start != current.start_from:
                raise InvalidInput(
                    "start_from applies when a subscription is created; seek a stopped "
                    "subscription to move it"
                )
        return Policies(
            filter=None if self.filter is None else parse_filter(self.filter),
            circuit_breaker=None if breaker is None else BreakerPolicy(**breaker.model_dump()),
            auto_pause_after_s=self.auto_pause_after_s,
            dead_letter_window=None if window is None else DeadLetterWindow(**window.model_dump()),
            start_from=start,
        )


# How long a rotation's previous secret keeps signing unless said otherwise: a day.
DEFAULT_ROTATION_OVERLAP_MS = 24 * 3600 * 1000
MAX_ROTATION_OVERLAP_MS = 30 * 24 * 3600 * 1000


class SecretRotation(Body):
    """``POST .../signing-secrets``: the new secret, and how long the current one keeps
    signing beside it (0 ends it at once)."""

    signing_secret: str = Field(min_length=1, max_length=512)
    previous_expires_in_ms: int = Field(
        DEFAULT_ROTATION_OVERLAP_MS, ge=0, le=MAX_ROTATION_OVERLAP_MS
    )


class SubscriptionCreate(SubscriptionConfig):
    name: Name
    topic: Name


class SubscriptionUpdate(SubscriptionConfig):
    """A full replacement. ``signing_secret`` left out keeps the stored one; null removes it.
    ``endpoint.headers`` left out keeps the stored headers ({} removes them): a view never
    shows their values, so a client cannot send them back."""

    version: int = Field(ge=1)
    name: Name | None = None
    topic: Name | None = None


# Views


def project_view(project: Project) -> dict[str, Any]:
    return {
        "name": project.name,
        "description": project.description,
        "created_at_ms": project.created_at_ms,
        "quota": {
            "messages_per_second": project.quota.messages_per_second,
            "bytes_per_second": project.quota.bytes_per_second,
        },
    }


def topic_view(topic: Topic, shared_log: str | None = None) -> dict[str, Any]:
    """A topic as the API shows it; ``shared_log``: the shared ingest log its records wait in
    (decision 0010), if any, instead of an ingest topic of its own."""
    return {
        "project": topic.project,
        "name": topic.name,
        "grouped": topic.grouped,
        "partitions": topic.partitions,
        "retention_hours": topic.retention_hours,
        "dedup_window_seconds": topic.dedup_window_seconds,
        "created_at_ms": topic.created_at_ms,
        "kafka": {
            "ingest_topic": shared_log or names.ingest_topic(topic.project, topic.name),
            "main_topic": names.main_topic(topic.project, topic.name),
            "ingest_rejects_topic": names.ingest_rejects_topic(topic.project, topic.name),
        },
    }


def secrets_view(sub: Subscription, now: int) -> list[dict[str, Any]]:
    """The subscription's signing secrets still signing at ``now``: ids and times only."""
    return [
        {"id": s.id, "created_at_ms": s.created_at_ms, "expires_at_ms": s.expires_at_ms}
        for s in sub.signing_secrets
        if s.active(now)
    ]


def subscription_view(sub: Subscription) -> dict[str, Any]:
    """Everything but the secrets, which are write-only: the signing secrets (shown by id)
    and the endpoint's header values (shown by name)."""
    held = secrets_view(sub, now_ms())
    return {
        "project": sub.project,
        "name": sub.name,
        "topic": sub.topic,
        "grouped": sub.grouped,
        "endpoint": {
            "url": sub.endpoint.url,
            "method": sub.endpoint.method,
            "header_names": sub.endpoint.header_names,
            "timeout_ms": sub.endpoint.timeout_ms,
            **access_view(sub.endpoint),
        },
        "retry": {
            "delays_ms": list(sub.retry.delays_ms),
            "retryable_codes": (
                None if sub.retry.retryable_codes is None else list(sub.retry.retryable_codes)
            ),
        },
        "dead_letter_policy": sub.dead_letter_policy.value,
        "max_in_flight": sub.max_in_flight,
        "rate_limit_per_second": sub.rate_limit_per_second,
        "has_signing_secret": bool(held),
        "signing_secrets": held,
        "state": sub.state.value,
        "paused_reason": sub.paused_reason,
        **sub.policies.json(),
        "version": sub.version,
        "created_at_ms": sub.created_at_ms,
        "kafka": {
            "consumer_group": names.consumer_group(sub.project, sub.name),
            "retry_topics": [
                names.retry_topic(sub.project, sub.name, n) for n in range(1, sub.retry.tiers + 1)
            ],
            "dlq_topic": names.dlq_topic(sub.project, sub.name),
        },
    }


# Response documentation


class ErrorDetail(Out):
    code: str
    message: str


class ErrorOut(Out):
    error: ErrorDetail


class QuotaOut(Out):
    # null: the settings' default applies (SETU_PRODUCE_QUOTA_*), no limit if unset too.
    messages_per_second: float | None
    bytes_per_second: float | None


class ProjectOut(Out):
    name: str
    description: str
    created_at_ms: int
    quota: QuotaOut


class ProjectsOut(Out):
    projects: list[ProjectOut]


class KafkaTopicsOut(Out):
    ingest_topic: str
    main_topic: str
    ingest_rejects_topic: str


class TopicOut(Out):
    project: str
    name: str
    grouped: bool
    partitions: int
    retention_hours: int
    dedup_window_seconds: int
    created_at_ms: int
    kafka: KafkaTopicsOut
    # Only on GET of one topic: records the ingest job set aside (README: rejected records)
    ingest_rejected: int | None = None


class TopicsOut(Out):
    topics: list[TopicOut]


class CertificateOut(Out):
    subject: str
    not_after_ms: int
    sha256: str  # the certificate's fingerprint, hex


class EndpointTlsOut(Out):
    client_certificate: CertificateOut | None
    # The key is write-only: whether one is held.
    has_client_key: bool
    ca_certificate: CertificateOut | None


class OAuth2Out(Out):
    token_url: str
    client_id: str
    scopes: list[str]
    audience: str | None
    client_auth: str
    # The client secret is write-only: whether one is held.
    has_client_secret: bool


class EndpointOut(Out):
    url: str
    method: str
    # The names of the headers sent with every call; their values are write-only.
    header_names: list[str]
    timeout_ms: int
    tls: EndpointTlsOut | None
    oauth2: OAuth2Out | None
    proxy: str | None


class RetryOut(Out):
    delays_ms: list[int]
    retryable_codes: list[int] | None


class SigningSecretOut(Out):
    id: str
    created_at_ms: int
    # Set on a rotation's previous secret: it stops signing then.
    expires_at_ms: int | None


class SigningSecretsOut(Out):
    signing_secrets: list[SigningSecretOut]


class BreakerOut(Out):
    failure_ratio: float
    min_calls: int
    window_s: int
    open_s: int


class DeadLetterWindowOut(Out):
    size: int
    threshold: int


class SubscriptionKafkaOut(Out):
    consumer_group: str
    retry_topics: list[str]
    dlq_topic: str


class SubscriptionOut(Out):
    project: str
    name: str
    topic: str
    grouped: bool
    endpoint: EndpointOut
    retry: RetryOut
    dead_letter_policy: str
    max_in_flight: int
    rate_limit_per_second: float | None
    has_signing_secret: bool
    signing_secrets: list[SigningSecretOut]
    state: Literal["running", "paused", "stopped"]
    # Why a policy paused it (docs/policies.md §3); null otherwise.
    paused_reason: str | None
    filter: dict[str, Any] | None
    circuit_breaker: BreakerOut | None
    auto_pause_after_s: int | None
    dead_letter_window: DeadLetterWindowOut | None
    start_from: str | dict[str, int]
    version: int
    created_at_ms: int
    kafka: SubscriptionKafkaOut


class SubscriptionsOut(Out):
    subscriptions: list[SubscriptionOut]


class StateOut(Out):
    state: Literal["running", "paused", "stopped"]


class StopBody(Body):
    """``POST .../stop`` (docs/policies.md §6)."""

    # graceful: calls in progress finish (within the workers' drain timeout), then offsets
    # are committed; forced: calls in progress are abandoned and made again on start.
    mode: Literal["graceful", "forced"] = "graceful"
    # How long the answer waits for the workers running the subscription to confirm.
    wait_ms: int = Field(30_000, ge=0, le=120_000)


class StopWorkerOut(Out):
    worker: str
    stopped_at_ms: int
    # Calls in progress that a forced stop abandoned (made again on start).
    abandoned_calls: int
    # False when work outlived the drain timeout and was cut short.
    drained: bool


class StopOut(Out):
    state: Literal["running", "paused", "stopped"]
    mode: Literal["graceful", "forced"]
    requested_at_ms: int
    # Whether every worker that ran the subscription has confirmed the stop.
    confirmed: bool
    workers: list[StopWorkerOut]
    # Workers that ran it and have not confirmed within wait_ms.
    pending_workers: list[str]


class ProducerMarkOut(Out):
    producer_id: str
    last_sequence_id: int


class MessageIdOut(Out):
    message_id: str


class BatchResultOut(Out):
    message_id: str
    status: Literal["ok", "error"]
    error: str | None = None


class BatchOut(Out):
    results: list[BatchResultOut]


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` entries for error statuses."""
    return {status: {"model": ErrorOut} for status in statuses}


MAX_KEY_TOPICS = 100


class KeyCreate(Body):
    """A new key of the project in the path (``POST /v1/projects/{p}/keys``)."""

    name: str = Field(min_length=1, max_length=100, examples=["orders-service"])
    role: Literal["owner", "operator", "producer", "viewer"]
    # A producer key limited to these topics (None: every topic of the project).
    topics: list[Name] | None = Field(None, min_length=1, max_length=MAX_KEY_TOPICS)
    expires_at_ms: int | None = Field(None, ge=0, le=2**63 - 1)


class AnyKeyCreate(Body):
    """A new key of any project, or an admin key (``POST /v1/keys``)."""

    name: str = Field(min_length=1, max_length=100, examples=["platform-admin"])
    role: Literal["admin", "owner", "operator", "producer", "viewer"]
    # Required for every role but admin, refused for admin.
    project: Name | None = None
    topics: list[Name] | None = Field(None, min_length=1, max_length=MAX_KEY_TOPICS)
    expires_at_ms: int | None = Field(None, ge=0, le=2**63 - 1)


class KeyOut(Out):
    id: str
    name: str
    role: str
    project: str | None
    topics: list[str] | None
    created_at_ms: int
    expires_at_ms: int | None
    last_used_at_ms: int | None


class KeyCreatedOut(KeyOut):
    # The key itself: shown in this answer only, never again.
    key: str


class KeysOut(Out):
    keys: list[KeyOut]


def key_view(key: ApiKey) -> dict[str, Any]:
    return {
        "id": key.key_id,
        "name": key.name,
        "role": key.role.value,
        "project": key.project,
        "topics": list(key.topics) if key.topics is not None else None,
        "created_at_ms": key.created_at_ms,
        "expires_at_ms": key.expires_at_ms,
        "last_used_at_ms": key.last_used_at_ms,
    }


EventType = Literal[
    "subscription.paused",
    "endpoint.breaker_opened",
    "endpoint.breaker_closed",
    "message.dead_lettered",
    "group.parked",
]


class NotificationsBody(Body):
    """``PUT /v1/projects/{p}/notifications`` (docs/policies.md §4)."""

    url: str = Field(max_length=2048, examples=["https://ops.example.com/setu-events"])
    # Left out: the stored one is kept; null: calls are not signed.
    signing_secret: str | None = Field(None, min_length=1, max_length=512)
    events: list[EventType] = Field(min_length=1, max_length=5)


class NotificationsOut(Out):
    project: str
    url: str
    events: list[str]
    has_signing_secret: bool
    updated_at_ms: int


class FilterTestBody(Body):
    """``POST /v1/projects/{p}/filters/test``: a filter (DESIGN §10, docs/policies.md §1) and a
    sample message to judge."""

    filter: dict[str, Any] = Field(
        examples=[{"all": [{"header": "X_REGION", "prefix": "eu-"}, {"body": "total", "gte": 100}]}]
    )
    # The sample's body: text, or base64 for binary (exactly one).
    body: str | None = Field(None, examples=['{"total": 120}'])
    body_base64: str | None = None
    headers: dict[str, str] | None = Field(None, examples=[{"X_REGION": "eu-west"}])
    group_id: str | None = Field(None, max_length=256)


class FilterTestOut(Out):
    matches: bool
