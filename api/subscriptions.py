"""Subscriptions: ``/v1/projects/{project}/subscriptions`` (docs/design.md §5).

Create makes the retry-tier and dead-letter topics and starts the subscription ``running``.
PUT replaces the configuration when its ``version`` matches (409 otherwise); more retry tiers
get their topics first. Lifecycle actions change only ``state``; delivery workers poll it.
Signing secrets are write-only: views show their ids and times, never a value. A rotation
(``POST .../signing-secrets``) adds a new secret and keeps the previous one signing until it
expires, so receivers can switch over (docs/security.md §5).
"""

from __future__ import annotations

import asyncio
import dataclasses
import secrets
import time
from typing import Any

from fastapi import APIRouter, Depends, Request
from redis.exceptions import RedisError
from starlette.responses import Response

from api import control
from api.auth import allow, authorize
from api.context import Services, blocking, services
from api.endpoint_access import check_bearer_alone, check_oauth2, check_proxy, check_tls
from api.responses import reply
from api.schemas import (
    EndpointBody,
    SecretRotation,
    SigningSecretsOut,
    StateOut,
    StopBody,
    StopOut,
    SubscriptionConfig,
    SubscriptionCreate,
    SubscriptionOut,
    SubscriptionsOut,
    SubscriptionUpdate,
    errors,
    secrets_view,
    subscription_view,
)
from api.validation import check_endpoint_headers, check_signing_secret, endpoint_origin
from setu.access import Permission
from setu.clock import now_ms
from setu.egress import Egress
from setu.errors import DependencyUnavailable, InvalidInput
from setu.model import (
    DeadLetterPolicy,
    Endpoint,
    RetryPolicy,
    SigningSecret,
    StopMode,
    Subscription,
    SubscriptionState,
    Topic,
)
from setu.names import validate_name
from setu.policies import Policies
from state.lifecycle import LifecycleAction
from state.workers import WorkerReports

# How often a stop request looks for the workers' confirmations.
STOP_POLL_S = 0.1

router = APIRouter(
    dependencies=[Depends(authorize)],
    responses=errors(401, 403),
    prefix="/v1/projects/{project}/subscriptions",
    tags=["subscriptions"],
)


def to_subscription(
    project: str,
    name: str,
    topic: Topic,
    config: SubscriptionConfig,
    *,
    signing_secrets: tuple[SigningSecret, ...],
    default_grouped: bool,
    current: Policies | None = None,
    egress: Egress | None = None,
) -> Subscription:
    """The subscription a request describes (pure; the endpoint host is checked elsewhere).
    ``current``: the stored policies of a subscription being replaced; ``egress``: the
    installation's egress proxies (none if None)."""
    return Subscription(
        project=project,
        name=validate_name("subscription", name),
        topic=topic.name,
        grouped=default_grouped if config.grouped is None else config.grouped,
        endpoint=Endpoint(
            url=config.endpoint.url,
            method=config.endpoint.method,
            headers=check_endpoint_headers(config.endpoint.headers.items()),
            timeout_ms=config.endpoint.timeout_ms,
            tls=check_tls(config.endpoint, now_ms()),
            oauth2=check_oauth2(config.endpoint),
            proxy=check_proxy(config.endpoint.proxy, egress or Egress()),
        ),
        retry=RetryPolicy(
            delays_ms=tuple(config.retry.delays_ms),
            retryable_codes=(
                None
                if config.retry.retryable_codes is None
                else tuple(sorted(set(config.retry.retryable_codes)))
            ),
        ),
        dead_letter_policy=DeadLetterPolicy(config.dead_letter_policy),
        max_in_flight=config.max_in_flight,
        rate_limit_per_second=config.rate_limit_per_second,
        signing_secrets=signing_secrets,
        state=SubscriptionState.RUNNING,
        policies=config.policies(current),
    )


@router.post(
    "",
    status_code=201,
    response_model=None,
    summary="Create a subscription and its retry and dead-letter topics",
    responses={
        201: {"model": SubscriptionOut},
        200: {"model": SubscriptionOut},
        **errors(400, 404, 409, 503),
    },
)
@allow(Permission.MANAGE)
async def create_subscription(request: Request, project: str, body: SubscriptionCreate) -> Response:
    s = services(request)
    await check_endpoints(s, body.endpoint)
    topic = await blocking(s.store.get_topic, project, validate_name("topic", body.topic))
    sub = to_subscription(
        project,
        body.name,
        topic,
        body,
        signing_secrets=new_secrets(body.signing_secret),
        default_grouped=topic.grouped,
        egress=s.settings.egress(),
    )
    stored, created = await control.create_subscription(s, sub)
    return reply(SubscriptionOut, subscription_view(stored), 201 if created else 200)


async def check_endpoints(s: Services, endpoint: EndpointBody) -> None:
    """The webhook URL's host, and the OAuth2 token URL's, by the address rule."""
    await control.check_endpoint(s, endpoint.url)
    if endpoint.oauth2 is not None:
        await control.check_endpoint(s, endpoint.oauth2.token_url, "endpoint.oauth2.token_url")


def new_secret(value: str) -> SigningSecret:
    """A checked secret with a fresh id, current from now."""
    return SigningSecret(
        id="ss_" + secrets.token_hex(8), value=check_signing_secret(value), created_at_ms=now_ms()
    )


def new_secrets(value: str | None) -> tuple[SigningSecret, ...]:
    return () if value is None else (new_secret(value),)


def replaced_secrets(
    held: tuple[SigningSecret, ...], value: str | None
) -> tuple[SigningSecret, ...]:
    """A PUT's ``signing_secret``: null removes every secret, the current value keeps them as
    they are, another value replaces them all at once (a rotation without overlap)."""
    if value is not None and held and held[0].value == value:
        return held
    return new_secrets(value)


@router.get("", response_model=None, responses={200: {"model": SubscriptionsOut}, **errors(404)})
@allow(Permission.READ)
async def list_subscriptions(request: Request, project: str) -> Response:
    found = await blocking(services(request).store.list_subscriptions, project)
    return reply(SubscriptionsOut, {"subscriptions": [subscription_view(sub) for sub in found]})


@router.get(
    "/{subscription}",
    response_model=None,
    responses={200: {"model": SubscriptionOut}, **errors(404)},
)
@allow(Permission.READ)
async def get_subscription(request: Request, project: str, subscription: str) -> Response:
    found = await blocking(services(request).store.get_subscription, project, subscription)
    return reply(SubscriptionOut, subscription_view(found))


@router.put(
    "/{subscription}",
    response_model=None,
    summary="Replace a subscription's configuration (409 unless version matches)",
    responses={200: {"model": SubscriptionOut}, **errors(400, 404, 409, 503)},
)
@allow(Permission.MANAGE)
async def update_subscription(
    request: Request, project: str, subscription: str, body: SubscriptionUpdate
) -> Response:
    s = services(request)
    if body.name is not None and body.name != subscription:
        raise InvalidInput("name in the body differs from the path")
    current = await blocking(s.store.get_subscription, project, subscription)
    if body.topic is not None and body.topic != current.topic:
        raise InvalidInput("topic of a subscription cannot change; create another subscription")
    await check_endpoints(s, body.endpoint)
    topic = await blocking(s.store.get_topic, project, current.topic)
    kept = "signing_secret" not in body.model_fields_set
    sub = to_subscription(
        project,
        subscription,
        topic,
        body,
        signing_secrets=(
            current.signing_secrets
            if kept
            else replaced_secrets(current.signing_secrets, body.signing_secret)
        ),
        default_grouped=current.grouped,
        current=current.policies,
        egress=s.settings.egress(),
    )
    if endpoint_origin(body.endpoint.url) == endpoint_origin(current.endpoint.url):
        # Header values, TLS and OAuth2 settings a request leaves out are kept for the server
        # they were given for, never taken to another one: a new origin gets only what its
        # request sends (docs/security.md §5).
        given = body.endpoint.model_fields_set
        stored = {
            field: getattr(current.endpoint, field)
            for field in ("headers", "tls", "oauth2")
            if field not in given
        }
        sub = dataclasses.replace(sub, endpoint=dataclasses.replace(sub.endpoint, **stored))
        if sub.endpoint.oauth2 is not None:
            check_bearer_alone(sub.endpoint.header_names)
    updated = await control.update_subscription(s, sub, body.version)
    return reply(SubscriptionOut, subscription_view(updated))


@router.post(
    "/{subscription}/signing-secrets",
    status_code=201,
    response_model=None,
    summary="Rotate the signing secret: the new one signs from now, the previous one until it "
    "expires",
    responses={201: {"model": SigningSecretsOut}, **errors(400, 404)},
)
@allow(Permission.MANAGE)
async def rotate_signing_secret(
    request: Request, project: str, subscription: str, body: SecretRotation
) -> Response:
    secret = new_secret(body.signing_secret)
    updated = await blocking(
        services(request).store.rotate_signing_secret,
        project,
        subscription,
        secret,
        secret.created_at_ms + body.previous_expires_in_ms,
    )
    await control.announce(services(request))
    return reply(
        SigningSecretsOut, {"signing_secrets": secrets_view(updated, secret.created_at_ms)}, 201
    )


@router.delete(
    "/{subscription}/signing-secrets/{secret_id}",
    status_code=204,
    response_model=None,
    summary="Remove one signing secret (ends a rotation early)",
    responses=errors(404),
)
@allow(Permission.MANAGE)
async def remove_signing_secret(
    request: Request, project: str, subscription: str, secret_id: str
) -> Response:
    s = services(request)
    await blocking(s.store.remove_signing_secret, project, subscription, secret_id)
    await control.announce(s)
    return Response(status_code=204)


@router.delete(
    "/{subscription}",
    status_code=204,
    response_model=None,
    summary="Delete a subscription, its Kafka topics, consumer group and Redis state",
    responses=errors(404, 409, 503),
)
@allow(Permission.MANAGE)
async def delete_subscription(request: Request, project: str, subscription: str) -> Response:
    await control.delete_subscription(services(request), project, subscription)
    return Response(status_code=204)


async def _lifecycle(
    request: Request, project: str, subscription: str, action: LifecycleAction
) -> Response:
    store = services(request).store
    updated = await blocking(store.apply_lifecycle, project, subscription, action)
    await control.announce(services(request))
    return reply(StateOut, {"state": updated.state.value})


_LIFECYCLE_RESPONSES = {200: {"model": StateOut}, **errors(404, 409)}


@router.post(
    "/{subscription}/start",
    summary="Run a subscription",
    response_model=None,
    responses=_LIFECYCLE_RESPONSES,
)
@allow(Permission.OPERATE)
async def start(request: Request, project: str, subscription: str) -> Response:
    return await _lifecycle(request, project, subscription, LifecycleAction.START)


@router.post(
    "/{subscription}/stop",
    summary="Stop and release partitions: graceful (calls in progress finish) or forced "
    "(they are abandoned and made again on start); waits for the workers to confirm",
    response_model=None,
    responses={200: {"model": StopOut}, **errors(400, 404, 503)},
)
@allow(Permission.OPERATE)
async def stop(
    request: Request, project: str, subscription: str, body: StopBody | None = None
) -> Response:
    s = services(request)
    wanted = body or StopBody.model_validate({})
    workers = s.redis.workers()
    try:
        # The workers running it now are the ones whose confirmation the answer waits for.
        running = await workers.fresh_by_worker(project, subscription, now_ms())
    except RedisError as exc:
        raise DependencyUnavailable(f"Redis: {exc}") from exc
    stopped = await blocking(s.store.request_stop, project, subscription, StopMode(wanted.mode))
    await control.announce(s)
    assert stopped.stop_requested_at_ms is not None
    deadline = time.monotonic() + wanted.wait_ms / 1000
    while True:
        report = await stop_report(workers, stopped, list(running))
        if report["confirmed"] or time.monotonic() >= deadline:
            return reply(StopOut, report)
        await asyncio.sleep(STOP_POLL_S)


async def stop_report(
    workers: WorkerReports, sub: Subscription, running: list[str]
) -> dict[str, Any]:
    """How far the latest stop of ``sub`` got: the workers in ``running`` that confirmed it,
    and those that have not (yet)."""
    requested = sub.stop_requested_at_ms
    try:
        confirmations = await workers.stop_confirmations(sub.project, sub.name)
    except RedisError as exc:
        raise DependencyUnavailable(f"Redis: {exc}") from exc
    done = {
        worker: c for worker, c in confirmations.items() if c.get("requested_at_ms") == requested
    }
    return {
        "state": sub.state.value,
        "mode": sub.stop_mode.value,
        "requested_at_ms": requested,
        "confirmed": all(worker in done for worker in running),
        "workers": [
            {
                "worker": worker,
                "stopped_at_ms": c["stopped_at_ms"],
                "abandoned_calls": c["abandoned_calls"],
                "drained": c["drained"],
            }
            for worker, c in sorted(done.items())
        ],
        "pending_workers": sorted(w for w in running if w not in done),
    }


@router.post(
    "/{subscription}/pause",
    summary="Pause dispatch",
    response_model=None,
    responses=_LIFECYCLE_RESPONSES,
)
@allow(Permission.OPERATE)
async def pause(request: Request, project: str, subscription: str) -> Response:
    return await _lifecycle(request, project, subscription, LifecycleAction.PAUSE)


@router.post(
    "/{subscription}/resume",
    summary="Resume a paused subscription",
    response_model=None,
    responses=_LIFECYCLE_RESPONSES,
)
@allow(Permission.OPERATE)
async def resume(request: Request, project: str, subscription: str) -> Response:
    return await _lifecycle(request, project, subscription, LifecycleAction.RESUME)
