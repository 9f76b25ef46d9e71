"""One webhook call per attempt: the request (docs/design.md §5), the subscription's limits,
the outcome.

Every call carries the body as published, the producer's ``X_*`` headers, ``X_MESSAGE_ID``,
``X_GROUP_ID`` (when the message has one), ``X_DELIVERY_ATTEMPT`` (1-based), ``X_DELIVER_AT``
(when it was scheduled), the endpoint's own
fixed headers, the Standard Webhooks headers and the W3C ``traceparent`` (setu/tracing.py): the
call's own span's when tracing, else the producer's as it came. :func:`request_headers` builds
all but the last, purely.

:class:`WebhookSender` enforces the endpoint timeout and ``rate_limit_per_second`` (a token
bucket, this worker's or the subscription's shared one), and classifies the answer.
``max_in_flight`` is the dispatcher's pool size (delivery/dispatcher.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from opentelemetry.trace import SpanKind

from delivery.egress import Route
from delivery.http import HttpClient, HttpError, RefusedAddress, Response, Target, UnsafeRequest
from delivery.oauth2 import TokenSource
from delivery.ratelimit import SharedRate, Take, TokenBucket
from setu import headers as produce_headers
from setu import tracing
from setu.clock import now_ms
from setu.egress import Egress, UnknownProxy
from setu.envelope import H_TRACEPARENT, H_TRACESTATE, Envelope
from setu.model import Subscription
from setu.outcome import Outcome, Verdict, classify_error, classify_status
from setu.replay import replay_webhook_id
from setu.signing import signing_key, webhook_headers

DEFAULT_CONTENT_TYPE = "application/octet-stream"


def request_headers(
    sub: Subscription,
    envelope: Envelope,
    attempt: int,
    timestamp_s: int,
    keys: Sequence[bytes],
    replay: str | None = None,
) -> list[tuple[str, str]]:
    """The headers of one call, in a fixed order: endpoint, producer, Setu, Standard Webhooks.

    Content-Type: the endpoint's fixed one if it has one, else the producer's, else
    ``application/octet-stream`` (docs/policies.md §7). A replayed call (``replay``: the
    replay's id) names its replay and has a ``webhook-id`` of its own (docs/replays.md)."""
    out = list(sub.endpoint.headers)
    if not any(name.lower() == "content-type" for name, _ in out):
        out.append(("content-type", envelope.content_type or DEFAULT_CONTENT_TYPE))
    out.extend(envelope.headers)
    out.append((produce_headers.MESSAGE_ID, envelope.message_id))
    if envelope.group_id is not None:
        out.append((produce_headers.GROUP_ID, envelope.group_id))
    out.append((produce_headers.DELIVERY_ATTEMPT, str(attempt)))
    if envelope.deliver_at_ms:  # the time its producer chose (docs/scheduling.md)
        out.append((produce_headers.DELIVER_AT, str(envelope.deliver_at_ms)))
    webhook_id = envelope.message_id
    if replay is not None:
        out.append((produce_headers.REPLAY_ID, replay))
        webhook_id = replay_webhook_id(envelope.message_id, replay)
    out.extend(webhook_headers(webhook_id, timestamp_s, envelope.body, keys))
    return out


class WebhookSender:
    """Calls one subscription's endpoint within its limits. Reconfigure with :meth:`update`."""

    def __init__(
        self,
        sub: Subscription,
        client: HttpClient,
        *,
        clock: Callable[[], int] = now_ms,
        shared_rate: Take | None = None,
        egress: Egress | None = None,
    ) -> None:
        """``shared_rate``: the subscription's rate bucket shared by its workers
        (delivery/ratelimit.py); None: a bucket of this worker's own. ``egress``: the
        proxies the worker was configured with (none if None)."""
        self._client = client
        self._clock = clock
        self._shared_rate = shared_rate
        self._egress = egress or Egress()
        self._route: Route | None = None
        self._tokens: TokenSource | None = None
        self.update(sub)

    def update(self, sub: Subscription) -> None:
        """Takes a subscription's new endpoint and limits; calls in flight finish as they are."""
        self.sub = sub
        self._target = Target.parse(sub.endpoint.url)
        endpoint = sub.endpoint
        # How calls leave (docs/security.md §4): None while the named proxy is unknown here,
        # and every call then fails saying so.
        self._route_error: str | None = None
        try:
            route: Route | None = Route(endpoint.tls, self._egress.proxy(endpoint.proxy))
        except UnknownProxy as exc:
            route, self._route_error = None, str(exc)
        if route != self._route:
            if route is not None:
                self._client.hold(route)
            if self._route is not None:
                self._client.release(self._route)
        self._route = route
        held = self._tokens
        if endpoint.oauth2 is None or route is None:
            self._tokens = None
        elif held is None or held.credentials != endpoint.oauth2 or held.route != route:
            self._tokens = TokenSource(endpoint.oauth2, self._client, route)
        self._method = sub.endpoint.method.upper()
        self._timeout_s = sub.endpoint.timeout_ms / 1000
        # (HMAC key, expiry) of each signing secret: a rotation's previous secret stops
        # signing at its expiry without waiting for the next configuration change.
        self._keys = [(signing_key(s.value), s) for s in sub.signing_secrets]
        rate = sub.rate_limit_per_second
        self._bucket: TokenBucket | None = None
        self._shared: SharedRate | None = None
        if rate and self._shared_rate is not None:
            self._shared = SharedRate(self._shared_rate, rate)
        elif rate:
            self._bucket = TokenBucket(rate, now=time.monotonic())

    async def send(self, envelope: Envelope, attempt: int, replay: str | None = None) -> Outcome:
        """Calls the endpoint once (after the rate limit allows) and classifies the answer;
        ``replay``: the id of the replay the call belongs to, if any."""
        if self._bucket is not None:
            wait = self._bucket.reserve(time.monotonic())
            if wait > 0:
                await asyncio.sleep(wait)
        elif self._shared is not None:
            await self._shared.acquire()
        return await self._call(envelope, attempt, replay)

    async def _call(self, envelope: Envelope, attempt: int, replay: str | None) -> Outcome:
        traced = tracing.current()
        if not traced.enabled:
            return await self._request(
                envelope, attempt, envelope.traceparent, envelope.tracestate, replay
            )
        attributes = {
            "messaging.system": "setu",
            "messaging.operation.type": "process",
            "messaging.destination.name": f"{self.sub.project}/{self.sub.topic}",
            "messaging.consumer.group.name": self.sub.name,
            "messaging.message.id": envelope.message_id,
            "setu.delivery.attempt": attempt,
            "http.request.method": self._method,
            "server.address": self._target.origin.host,
        }
        if envelope.group_id is not None:
            attributes["setu.group.id"] = envelope.group_id
        if replay is not None:
            attributes["setu.replay.id"] = replay
        parent = tracing.context_of(envelope.traceparent, envelope.tracestate)
        name = f"deliver {self.sub.name}"
        with tracing.span(traced, name, SpanKind.CLIENT, parent, attributes) as made:
            outcome = await self._request(envelope, attempt, *tracing.headers_of(made), replay)
            if outcome.status is not None:
                made.set_attribute("http.response.status_code", outcome.status)
            made.set_attribute("setu.delivery.verdict", outcome.verdict.value)
            if outcome.verdict is not Verdict.DELIVERED:
                tracing.failed(made, outcome.error or f"status {outcome.status}")
            return outcome

    async def _request(
        self,
        envelope: Envelope,
        attempt: int,
        traceparent: str | None,
        tracestate: str | None,
        replay: str | None = None,
    ) -> Outcome:
        now = self._clock()
        keys = [key for key, secret in self._keys if secret.active(now)]
        headers = request_headers(self.sub, envelope, attempt, now // 1000, keys, replay)
        if traceparent is not None:
            headers.append((H_TRACEPARENT, traceparent))
            if tracestate is not None:
                headers.append((H_TRACESTATE, tracestate))
        try:
            response = await self._authorized(headers, envelope.body)
        except (UnsafeRequest, RefusedAddress) as exc:
            return Outcome(Verdict.DEAD_LETTER, error=exc.reason, refused=True)
        except HttpError as exc:
            return classify_error(exc.reason)
        outcome = classify_status(
            response.status, self.sub.retry, response.headers.get("retry-after"), self._clock()
        )
        if response.excerpt:
            outcome = replace(outcome, excerpt=response.excerpt.decode("utf-8", "replace"))
        return outcome

    async def _authorized(self, headers: list[tuple[str, str]], body: bytes) -> Response:
        """The call, over the subscription's route, with its OAuth2 token if it has one: a
        401 drops the token and the call is made once more with a new one
        (delivery/oauth2.py)."""
        route = self._route
        if route is None:
            raise HttpError(self._route_error or "no route")
        tokens = self._tokens
        if tokens is None:
            return await self._client.request(
                self._method, self._target, headers, body, self._timeout_s, route
            )
        token = await tokens.token()
        response = await self._bearer(headers, body, route, token)
        if response.status != 401:
            return response
        tokens.drop(token)
        return await self._bearer(headers, body, route, await tokens.token())

    async def _bearer(
        self, headers: list[tuple[str, str]], body: bytes, route: Route, token: str
    ) -> Response:
        sent = [*headers, ("authorization", f"Bearer {token}")]
        return await self._client.request(
            self._method, self._target, sent, body, self._timeout_s, route
        )
