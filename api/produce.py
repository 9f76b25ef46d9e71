"""Produce endpoints: a 2xx only after Kafka acknowledged the write (docs/design.md §3).

Single produce takes the raw body and the headers of docs/design.md §2 and answers
``{"message_id": ...}``. Batch produce answers ``{"results": [{message_id, status, error?}]}``
with 200 when every message was acknowledged, 207 when some were not (those may or may not be
in Kafka: retry them with the same ids), and 503 when none was.

They are the hot path, so they look the topic up in the in-memory topic cache, read the body
straight from ASGI and build responses without pydantic. :class:`ProduceFastPath` serves them
ahead of FastAPI's router and dependency resolution, which cost several times the produce
itself; the routes below document them in the OpenAPI and serve them when the fast path is
not installed. Both call the same :func:`produce_one` and :func:`produce_many`.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable

import orjson
from fastapi import APIRouter, Depends, Request
from opentelemetry.trace import SpanKind
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from api.auth import allow, authenticated, authorize
from api.context import Services, services
from api.messages import (
    IngestRecord,
    batch_results,
    batch_status,
    check_body_size,
    parse_batch,
    scan_headers,
    schedule_limit_ms,
    single_envelope,
    trace_headers,
)
from api.metrics import ROUTE_KEY
from api.responses import error_body, error_headers, send_json
from api.schemas import BatchOut, MessageIdOut, errors
from api.topic_cache import CachedTopic
from setu import tracing
from setu.access import Permission, check
from setu.clock import now_ms
from setu.envelope import Envelope
from setu.errors import (
    DependencyUnavailable,
    InvalidInput,
    PayloadTooLarge,
    RateLimited,
    SetuError,
)

router = APIRouter(dependencies=[Depends(authorize)], responses=errors(401, 403), tags=["produce"])

TOPIC_PATH = "/v1/projects/{project}/topics/{topic}"
PRODUCE_PATH = TOPIC_PATH + "/produce"
BATCH_PATH = TOPIC_PATH + "/produce/batch"
# A produce path: project, topic, and "/batch" for batch produce.
PRODUCE_RE = re.compile(r"^/v1/projects/([^/]+)/topics/([^/]+)/produce(/batch)?$")

RawHeaders = Iterable[tuple[bytes, bytes]]
Reply = tuple[int, bytes]
"""HTTP status and JSON body"""

_IDENTITY_DOC = [
    {"name": name, "in": "header", "required": required, "schema": {"type": "string"}}
    for name, required in (
        ("X_MESSAGE_ID", True),
        ("X_GROUP_ID", False),
        ("X_PRODUCER_ID", False),
        ("X_SEQUENCE_ID", False),
        # Not before this time, epoch ms, or this many ms from now; grouped topics only
        # (docs/scheduling.md)
        ("X_DELIVER_AT", False),
        ("X_DELIVER_AFTER_MS", False),
    )
]
_RAW_BODY_DOC = {
    "required": True,
    "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
}
_BATCH_BODY_DOC = {
    "required": True,
    "content": {
        "application/json": {
            "example": {
                "messages": [
                    {"message_id": "m-1", "group_id": "order-7", "body": '{"total": 12}'},
                    {"message_id": "m-2", "group_id": "order-7", "body_base64": "AAEC"},
                ]
            }
        }
    },
}


async def read_body(receive: Receive, limit: int, declared: int | None) -> bytes:
    """The request body, refused with 413 as soon as it is known to exceed ``limit``."""
    if declared is not None:
        check_body_size(declared, limit)
    chunks = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise InvalidInput("the client went away before sending its whole body")
        chunk = message.get("body", b"")
        size += len(chunk)
        check_body_size(size, limit)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def produce_one(
    s: Services, project: str, topic: str, headers: RawHeaders, receive: Receive
) -> Reply:
    """One message from the raw body and the X_* headers; 200 after Kafka's ack."""
    entry = await s.topics.get(project, topic)
    scanned = scan_headers(headers)
    try:
        body = await read_body(receive, s.settings.max_message_bytes, scanned.length)
        envelope = single_envelope(
            scanned.found,
            body,
            grouped=entry.topic.grouped,
            produced_at_ms=now_ms(),
            topic_created_at_ms=entry.topic.created_at_ms,
            content_type=scanned.content_type,
            dedup_window_seconds=entry.topic.dedup_window_seconds,
            schedule_limit_ms=schedule_limit_ms(entry.topic, s.settings.max_delivery_delay_ms),
        )
    except SetuError:
        s.metrics.count_produced(project, topic, "rejected")
        raise
    await admit(s, project, topic, 1, len(body))
    traceparent, tracestate = tracing.request_context(scanned.traceparent, scanned.tracestate)
    traced = tracing.current()
    if not traced.enabled:
        # Not tracing: the producer's own context, if any, still travels to the webhook.
        envelope = envelope.evolve(traceparent=traceparent, tracestate=tracestate)
        return await send_one(s, project, topic, entry, envelope)
    attributes = produce_attributes(project, topic, 1)
    attributes["messaging.message.id"] = envelope.message_id
    parent = tracing.context_of(traceparent, tracestate)
    with tracing.span(traced, f"produce {topic}", SpanKind.PRODUCER, parent, attributes) as made:
        context = tracing.headers_of(made)
        envelope = envelope.evolve(traceparent=context[0], tracestate=context[1])
        return await send_one(s, project, topic, entry, envelope)


def produce_attributes(project: str, topic: str, messages: int) -> dict[str, str | int]:
    """The attributes of a produce span (OpenTelemetry's messaging conventions)."""
    return {
        "messaging.system": "setu",
        "messaging.operation.type": "send",
        "messaging.destination.name": f"{project}/{topic}",
        "messaging.batch.message_count": messages,
    }


async def send_one(
    s: Services, project: str, topic: str, entry: CachedTopic, envelope: Envelope
) -> Reply:
    started = time.perf_counter()
    headers = entry.with_ingest_headers(envelope.kafka_headers())
    try:
        await s.producer.send(entry.ingest_topic, envelope.key, envelope.body, headers)
    except PayloadTooLarge:
        s.metrics.count_produced(project, topic, "rejected")
        raise
    except DependencyUnavailable:
        s.metrics.count_produced(project, topic, "failed")
        raise
    s.metrics.observe_ack("single", time.perf_counter() - started)
    s.metrics.count_produced(project, topic, "ok")
    return 200, b'{"message_id":' + orjson.dumps(envelope.message_id) + b"}"


async def admit(s: Services, project: str, topic: str, messages: int, nbytes: int) -> None:
    """The project's produce quota (api/quotas.py): 429 when over it, nothing written."""
    try:
        await s.gate.admit(project, messages, nbytes)
    except RateLimited:
        s.metrics.count_produced(project, topic, "throttled", messages)
        raise


async def produce_many(
    s: Services, project: str, topic: str, headers: RawHeaders, receive: Receive
) -> Reply:
    """A validated batch, every message written, per-message results (see module doc)."""
    entry = await s.topics.get(project, topic)
    scanned = scan_headers(headers)
    try:
        payload = await read_body(receive, s.settings.max_batch_bytes, scanned.length)
        records = parse_batch(
            payload,
            grouped=entry.topic.grouped,
            produced_at_ms=now_ms(),
            max_message_bytes=s.settings.max_message_bytes,
            max_messages=s.settings.max_batch_messages,
            topic_created_at_ms=entry.topic.created_at_ms,
            dedup_window_seconds=entry.topic.dedup_window_seconds,
            schedule_limit_ms=schedule_limit_ms(entry.topic, s.settings.max_delivery_delay_ms),
        )
    except SetuError:
        s.metrics.count_produced(project, topic, "rejected")
        raise
    await admit(s, project, topic, len(records), sum(len(r.value) for r in records))
    traceparent, tracestate = tracing.request_context(scanned.traceparent, scanned.tracestate)
    traced = tracing.current()
    if not traced.enabled:
        records = with_trace(records, traceparent, tracestate)
        return await send_many(s, project, topic, entry, records)
    attributes = produce_attributes(project, topic, len(records))
    parent = tracing.context_of(traceparent, tracestate)
    with tracing.span(traced, f"produce {topic}", SpanKind.PRODUCER, parent, attributes) as made:
        records = with_trace(records, *tracing.headers_of(made))
        status, body = await send_many(s, project, topic, entry, records)
        if status >= 300:
            tracing.failed(made, f"{status}: not every message was written")
        return status, body


def with_trace(
    records: list[IngestRecord], traceparent: str | None, tracestate: str | None
) -> list[IngestRecord]:
    """The batch's records carrying the request's trace context (setu/tracing.py)."""
    if traceparent is None:
        return records
    traced = trace_headers(traceparent, tracestate)
    return [r._replace(headers=[*r.headers, *traced]) for r in records]


async def send_many(
    s: Services, project: str, topic: str, entry: CachedTopic, records: list[IngestRecord]
) -> Reply:
    started = time.perf_counter()
    failures = await s.producer.send_many(
        entry.ingest_topic,
        [(r.key, r.value, entry.with_ingest_headers(list(r.headers))) for r in records],
    )
    s.metrics.observe_ack("batch", time.perf_counter() - started)
    failed = sum(f is not None for f in failures)
    if failed:
        s.metrics.count_produced(project, topic, "failed", failed)
    if failed < len(failures):
        s.metrics.count_produced(project, topic, "ok", len(failures) - failed)
    status = batch_status(failures)
    document: dict[str, object] = {"results": batch_results(records, failures)}
    if status == 503:
        document.update(error_body(DependencyUnavailable.code, "Kafka acknowledged no message"))
    return status, orjson.dumps(document)


class ProduceFastPath:
    """ASGI middleware answering ``POST .../produce`` and ``.../produce/batch`` directly.

    Other requests pass through untouched. Errors take the API's error shape; the metrics
    middleware outside it labels the requests with the routes' templates.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        match = None
        if scope["type"] == "http" and scope["method"] == "POST":
            match = PRODUCE_RE.match(scope["path"])
        if match is None:
            await self.app(scope, receive, send)
            return
        project, topic, batch = match.groups()
        scope[ROUTE_KEY] = BATCH_PATH if batch else PRODUCE_PATH
        handler = produce_many if batch else produce_one
        extra: list[tuple[bytes, bytes]] = []
        try:
            if scope.get("query_string"):
                raise InvalidInput("produce takes no query parameters")
            s = scope["app"].state.services
            who = await authenticated(s.auth, scope)
            check(who, Permission.PRODUCE, project, topic)
            status, body = await handler(s, project, topic, scope["headers"], receive)
        except SetuError as exc:
            status, body = exc.status, orjson.dumps(error_body(exc.code, exc.message))
            extra = error_headers(exc)
        await send_json(send, status, body, extra)


@router.post(
    PRODUCE_PATH,
    summary="Produce one message",
    response_model=None,
    responses={200: {"model": MessageIdOut}, **errors(400, 404, 413, 429, 503)},
    openapi_extra={"parameters": _IDENTITY_DOC, "requestBody": _RAW_BODY_DOC},
)
@allow(Permission.PRODUCE)
async def produce(request: Request, project: str, topic: str) -> Response:
    status, body = await produce_one(
        services(request), project, topic, request.scope["headers"], request.receive
    )
    return Response(body, status_code=status, media_type="application/json")


@router.post(
    BATCH_PATH,
    summary="Produce a batch of messages",
    response_model=None,
    responses={
        200: {"model": BatchOut, "description": "every message acknowledged"},
        207: {"model": BatchOut, "description": "some messages failed: retry those"},
        **errors(400, 404, 413, 429, 503),
    },
    openapi_extra={"requestBody": _BATCH_BODY_DOC},
)
@allow(Permission.PRODUCE)
async def produce_batch(request: Request, project: str, topic: str) -> Response:
    status, body = await produce_many(
        services(request), project, topic, request.scope["headers"], request.receive
    )
    return Response(body, status_code=status, media_type="application/json")
