"""Produce endpoints: a 2xx only after Kafka acknowledged the write (DESIGN §3).

Single produce takes the raw body and the headers of DESIGN §2 and answers
``{"message_id": ...}``. Batch produce answers ``{"results": [{message_id, status, error?}]}``
with 200 when every message was acknowledged, 207 when some were not (those may or may not be
in Kafka: retry them with the same ids), and 503 when none was. Both look the topic up in the
in-memory topic cache and build responses without pydantic, because they are the hot path.
"""

from __future__ import annotations

import time

import orjson
from fastapi import APIRouter, Request
from starlette.responses import Response

from api.context import Services, services
from api.messages import (
    batch_results,
    batch_status,
    check_body_size,
    parse_batch,
    scan_headers,
    single_envelope,
)
from api.responses import JSON, error_body
from api.schemas import BatchOut, MessageIdOut, errors
from setu.clock import now_ms
from setu.errors import DependencyUnavailable, PayloadTooLarge, SetuError

router = APIRouter(tags=["produce"])

TOPIC_PATH = "/v1/projects/{project}/topics/{topic}"

_IDENTITY_DOC = [
    {"name": name, "in": "header", "required": required, "schema": {"type": "string"}}
    for name, required in (
        ("X_MESSAGE_ID", True),
        ("X_GROUP_ID", False),
        ("X_PRODUCER_ID", False),
        ("X_SEQUENCE_ID", False),
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


async def read_body(request: Request, limit: int, declared: int | None) -> bytes:
    """The request body, refused with 413 as soon as it is known to exceed ``limit``."""
    if declared is not None:
        check_body_size(declared, limit)
    chunks = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        check_body_size(size, limit)
        chunks.append(chunk)
    return b"".join(chunks)


def _count(s: Services, project: str, topic: str, outcome: str, amount: int = 1) -> None:
    s.metrics.produced.labels(project, topic, outcome).inc(amount)


@router.post(
    TOPIC_PATH + "/produce",
    summary="Produce one message",
    response_model=None,
    responses={200: {"model": MessageIdOut}, **errors(400, 404, 413, 503)},
    openapi_extra={"parameters": _IDENTITY_DOC, "requestBody": _RAW_BODY_DOC},
)
async def produce(request: Request, project: str, topic: str) -> Response:
    s = services(request)
    entry = await s.topics.get(project, topic)
    declared, x_headers = scan_headers(request.scope["headers"])
    try:
        body = await read_body(request, s.settings.max_message_bytes, declared)
        envelope = single_envelope(
            x_headers, body, grouped=entry.topic.grouped, produced_at_ms=now_ms()
        )
    except SetuError:
        _count(s, project, topic, "rejected")
        raise
    started = time.perf_counter()
    try:
        await s.producer.send(entry.ingest_topic, envelope.key, body, envelope.kafka_headers())
    except PayloadTooLarge:
        _count(s, project, topic, "rejected")
        raise
    except DependencyUnavailable:
        _count(s, project, topic, "failed")
        raise
    s.metrics.produce_ack_seconds.labels("single").observe(time.perf_counter() - started)
    _count(s, project, topic, "ok")
    return Response(
        b'{"message_id":' + orjson.dumps(envelope.message_id) + b"}",
        media_type="application/json",
    )


@router.post(
    TOPIC_PATH + "/produce/batch",
    summary="Produce a batch of messages",
    response_model=None,
    responses={
        200: {"model": BatchOut, "description": "every message acknowledged"},
        207: {"model": BatchOut, "description": "some messages failed: retry those"},
        **errors(400, 404, 413, 503),
    },
    openapi_extra={"requestBody": _BATCH_BODY_DOC},
)
async def produce_batch(request: Request, project: str, topic: str) -> Response:
    s = services(request)
    entry = await s.topics.get(project, topic)
    declared, _ = scan_headers(request.scope["headers"])
    try:
        payload = await read_body(request, s.settings.max_batch_bytes, declared)
        envelopes = parse_batch(
            payload,
            grouped=entry.topic.grouped,
            produced_at_ms=now_ms(),
            max_message_bytes=s.settings.max_message_bytes,
            max_messages=s.settings.max_batch_messages,
        )
    except SetuError:
        _count(s, project, topic, "rejected")
        raise
    started = time.perf_counter()
    failures = await s.producer.send_many(
        entry.ingest_topic, [(e.key, e.body, e.kafka_headers()) for e in envelopes]
    )
    s.metrics.produce_ack_seconds.labels("batch").observe(time.perf_counter() - started)
    failed = sum(f is not None for f in failures)
    if failed:
        _count(s, project, topic, "failed", failed)
    if failed < len(failures):
        _count(s, project, topic, "ok", len(failures) - failed)
    status = batch_status(failures)
    document: dict[str, object] = {"results": batch_results(envelopes, failures)}
    if status == 503:
        document.update(error_body(DependencyUnavailable.code, "Kafka acknowledged no message"))
    return JSON(document, status_code=status)
