"""Topics: ``/v1/projects/{project}/topics`` and producer marks (docs/design.md §5).

Creating a topic creates its Kafka ingest topic, main log and ingest reject topic; deleting it
removes the main log and the reject topic and empties and keeps the ingest topic
(``state.retired_topics``), and is refused (409) while subscriptions read it.
"""

from __future__ import annotations

from confluent_kafka import KafkaException
from fastapi import APIRouter, Depends, Request
from redis.exceptions import RedisError
from starlette.responses import Response

from api import control
from api.auth import allow, authorize
from api.context import blocking, services
from api.responses import reply
from api.schemas import ProducerMarkOut, TopicCreate, TopicOut, TopicsOut, errors, topic_view
from setu import names
from setu.access import Permission
from setu.errors import DependencyUnavailable
from setu.headers import PRODUCER_ID, check_id
from setu.model import Topic
from setu.names import validate_name
from state.producer_marks import MarksUnavailable

router = APIRouter(
    dependencies=[Depends(authorize)],
    responses=errors(401, 403),
    prefix="/v1/projects/{project}/topics",
    tags=["topics"],
)


@router.post(
    "",
    status_code=201,
    response_model=None,
    summary="Create a topic and its Kafka topics (the same body again: 200, different: 409)",
    responses={
        201: {"model": TopicOut},
        200: {"model": TopicOut},
        **errors(400, 404, 409, 503),
    },
)
@allow(Permission.MANAGE)
async def create_topic(request: Request, project: str, body: TopicCreate) -> Response:
    topic = Topic(
        project=project,
        name=validate_name("topic", body.name),
        grouped=body.grouped,
        partitions=body.partitions,
        retention_hours=body.retention_hours,
        dedup_window_seconds=body.dedup_window_seconds,
    )
    stored, created = await control.create_topic(services(request), topic)
    shared = services(request).settings.shared_ingest_log()
    return reply(TopicOut, topic_view(stored, shared), 201 if created else 200)


@router.get("", response_model=None, responses={200: {"model": TopicsOut}, **errors(404)})
@allow(Permission.READ)
async def list_topics(request: Request, project: str) -> Response:
    s = services(request)
    found = await blocking(s.store.list_topics, project)
    shared = s.settings.shared_ingest_log()
    return reply(TopicsOut, {"topics": [topic_view(t, shared) for t in found]})


@router.get(
    "/{topic}",
    response_model=None,
    summary="A topic, with how many records its ingest reject topic holds",
    responses={200: {"model": TopicOut}, **errors(404, 503)},
)
@allow(Permission.READ)
async def get_topic(request: Request, project: str, topic: str) -> Response:
    s = services(request)
    found = await blocking(s.store.get_topic, project, topic)
    reader = s.kafka_reader
    rejects = names.ingest_rejects_topic(project, topic)
    try:
        held = await blocking(reader.records_held, rejects, found.partitions)
    except KafkaException as exc:
        raise DependencyUnavailable(f"Kafka: {exc}") from exc
    view = topic_view(found, s.settings.shared_ingest_log())
    return reply(TopicOut, {**view, "ingest_rejected": held})


@router.delete(
    "/{topic}",
    status_code=204,
    response_model=None,
    summary="Delete a topic and its Kafka topics (409 while subscriptions exist)",
    responses=errors(404, 409, 503),
)
@allow(Permission.MANAGE)
async def delete_topic(request: Request, project: str, topic: str) -> Response:
    await control.delete_topic(services(request), project, topic)
    return Response(status_code=204)


@router.get(
    "/{topic}/producers/{producer_id}",
    response_model=None,
    summary="Highest sequence id accepted from a producer (-1 if none)",
    responses={200: {"model": ProducerMarkOut}, **errors(400, 404, 503)},
)
@allow(Permission.READ_PRODUCER)
async def get_producer_mark(
    request: Request, project: str, topic: str, producer_id: str
) -> Response:
    s = services(request)
    check_id(PRODUCER_ID, producer_id, required=True)
    found = await blocking(s.store.get_topic, project, topic)
    try:
        last = await s.redis.last_sequence(project, topic, producer_id, found.created_at_ms)
    except RedisError as exc:
        raise DependencyUnavailable(f"Redis: {exc}") from exc
    except MarksUnavailable as exc:
        raise DependencyUnavailable(str(exc)) from None
    return reply(ProducerMarkOut, {"producer_id": producer_id, "last_sequence_id": last})
