"""The API's composition: ``create_app(settings)`` wires routers, error handlers and metrics;
the lifespan opens the connections (never at import) and closes them on shutdown.

Store and Kafka admin calls are blocking and run in the thread pool; the produce path uses the
topic cache and the shared :class:`~api.producer.AckedProducer`, so it touches neither per
message. Startup fails with a clear message when the database is not migrated or a required
setting is missing.
"""

from __future__ import annotations

import gc
import importlib.metadata
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI
from redis.asyncio import Redis

from api import (
    filters,
    health,
    keys,
    notifications,
    operations,
    produce,
    projects,
    replays,
    scheduling,
    subscriptions,
    topics,
)
from api.auth import Authenticator
from api.console import serve_console
from api.context import Services, blocking
from api.docs import serve_docs
from api.gate import BodyLimits, RequestGate
from api.headers import SecurityHeaders
from api.metrics import ApiMetrics, MetricsMiddleware
from api.produce import ProduceFastPath
from api.producer import AckedProducer, api_producer_config
from api.provisioning import Provisioning
from api.quotas import ProjectQuotas, QuotaGate
from api.responses import install_error_handlers
from api.stream_server import StreamServer, stream_config
from api.topic_cache import TopicCache
from api.validation import known_query_only
from setu.addresses import Resolver, system_resolver
from setu.model import ProduceQuota, Topic
from setu.settings import Settings
from state import migrate
from state.kafka_admin import KafkaTopics
from state.kafka_reader import KafkaReader
from state.metadata import MetadataStore
from state.quota_buckets import RedisQuotaBuckets
from state.redis_clients import async_redis
from state.redis_state import RedisState
from state.sealing import required_sealer
from state.subscription_topics import SubscriptionTopics

# Every router the API serves (the access test walks their routes: docs/security.md §3).
ROUTERS = (
    projects,
    keys,
    topics,
    produce,
    subscriptions,
    operations,
    notifications,
    filters,
    replays,
    scheduling,
    health,
)


def _required(value: str | None, variable: str) -> str:
    if not value:
        raise RuntimeError(f"{variable} is not set; the API needs it")
    return value


log = logging.getLogger(__name__)

# A bootstrap key of 22 random base64 characters or more carries 128 bits.
MIN_ADMIN_KEY_CHARS = 22


def _version() -> str:
    try:
        return importlib.metadata.version("setu")
    except importlib.metadata.PackageNotFoundError:
        return "0.0.0"


def check_admin_key(settings: Settings) -> None:
    """Refuses a guessable bootstrap key; warns when authentication is off."""
    if not settings.auth_enabled:
        log.warning("SETU_AUTH_ENABLED=false: every request is answered as an admin's")
    key = settings.admin_key.get_secret_value() if settings.admin_key else None
    if key is not None and len(key) < MIN_ADMIN_KEY_CHARS:
        raise SystemExit(f"SETU_ADMIN_KEY must be at least {MIN_ADMIN_KEY_CHARS} characters")


async def open_services(
    settings: Settings, metrics: ApiMetrics, resolver: Resolver = system_resolver
) -> Services:
    bootstrap = _required(settings.kafka_bootstrap, "SETU_KAFKA_BOOTSTRAP")
    redis_url = _required(settings.redis_url, "SETU_REDIS_URL")
    database_url = settings.resolved_database_url()
    check_admin_key(settings)
    await blocking(migrate.require_head, database_url)
    store = MetadataStore(database_url, required_sealer(settings.secret_key))

    async def load_topic(project: str, topic: str) -> Topic | None:
        return await blocking(store.find_topic, project, topic)

    # How every Kafka client of the API reaches the broker (docs/security.md §8).
    kafka = settings.kafka_client_config()
    producer = AckedProducer(
        api_producer_config(
            bootstrap,
            ack_timeout_ms=settings.produce_timeout_ms,
            max_message_bytes=settings.max_message_bytes,
            extra=kafka,
        )
    )
    producer.start()
    metrics.watch_producer_queue(producer.__len__)
    client: Redis[bytes] = async_redis(
        settings, redis_url, socket_timeout=5, socket_connect_timeout=5
    )
    redis_state = RedisState(client)

    async def load_project_quota(project: str) -> ProduceQuota | None:
        found = await blocking(store.find_project, project)
        return None if found is None else found.quota

    quotas = ProjectQuotas(
        load_project_quota,
        ProduceQuota(
            settings.produce_quota_messages_per_second,
            settings.produce_quota_bytes_per_second or None,  # 0: no limit
        ),
    )
    kafka_admin = KafkaTopics(
        bootstrap,
        replication_factor=settings.kafka_replication_factor,
        max_message_bytes=settings.max_message_bytes,
        # One patience for every Kafka request the API makes.
        timeout_s=settings.produce_timeout_ms / 1000,
        client_config=kafka,
        dead_letter_retention_hours=settings.dead_letter_retention_hours,
        shared_log=settings.shared_ingest_log_spec(),
    )
    return Services(
        settings=settings,
        store=store,
        redis=redis_state,
        retired=redis_state.retired_topics(),
        kafka_admin=kafka_admin,
        provisioning=Provisioning(
            SubscriptionTopics(store.get_topic, kafka_admin), send=producer.send_to
        ),
        kafka_reader=KafkaReader(bootstrap, kafka),
        producer=producer,
        topics=TopicCache(load_topic, shared_log=settings.shared_ingest_log()),
        metrics=metrics,
        auth=Authenticator(
            store.keys,
            settings.admin_key.get_secret_value() if settings.admin_key else None,
            enabled=settings.auth_enabled,
        ),
        resolver=resolver,
        quotas=quotas,
        gate=QuotaGate(
            RedisQuotaBuckets(client),
            quotas.of,
            cached_quota_of=quotas.cached,
            on_unchecked=metrics.count_unchecked_quota,
        ),
    )


async def close_services(s: Services) -> None:
    try:
        await s.provisioning.close()
        await s.producer.close()
    finally:
        await s.redis.close()
        await blocking(s.kafka_reader.close)
        s.store.close()


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    s = await open_services(app.state.settings, app.state.metrics, app.state.resolver)
    app.state.services = s
    app.state.store = s.store
    app.state.kafka_admin = s.kafka_admin
    app.state.producer = s.producer
    app.state.authenticator = s.auth
    # Everything built so far lives as long as the process: keep it out of the collector's
    # full passes, which otherwise walk it every few hundred requests.
    stream = app.state.stream = await start_stream_server(s)
    gc.freeze()
    try:
        yield
    finally:
        try:
            if stream is not None:
                await stream.stop()
        finally:
            await close_services(s)


async def start_stream_server(s: Services) -> StreamServer | None:
    """The streaming produce listener when ``SETU_STREAM_PORT`` is set (docs/streaming.md)."""
    settings = s.settings
    if settings.stream_port is None:
        return None
    server = StreamServer(
        s,
        stream_config(
            settings.api_host,
            settings.stream_port,
            credits=settings.stream_credits,
            max_frame_bytes=settings.stream_max_frame_bytes,
            max_message_bytes=settings.max_message_bytes,
            buffer_bytes=settings.stream_buffer_bytes,
            max_sessions=settings.stream_max_sessions,
            lease_ms=settings.stream_lease_ms,
            ack_delay_ms=settings.stream_ack_delay_ms,
        ),
    )
    await server.start()
    return server


def create_app(settings: Settings, *, resolver: Resolver = system_resolver) -> FastAPI:
    """The Setu HTTP API (docs/design.md §5), with OpenAPI at /openapi.json and docs at /docs.
    ``resolver`` resolves webhook hosts when subscriptions are written."""
    app = FastAPI(
        title="Setu",
        version=_version(),
        summary="Kafka-backed ordered webhook delivery",
        lifespan=_lifespan,
        dependencies=[Depends(known_query_only)],
        # /docs is served from the package's own copy of Swagger UI (api/docs.py): no CDN.
        docs_url=None,
        redoc_url=None,
        # Setu exports Prometheus metrics of its own; FastAPI's OpenTelemetry hooks would cost
        # a provider lookup per request for nothing.
        telemetry={"tracing": False, "metrics": False, "logs": False, "operation_spans": False},
    )
    metrics = ApiMetrics(tenant_labels=settings.metrics_tenant_labels)
    app.state.settings = settings
    app.state.metrics = metrics
    app.state.resolver = resolver
    install_error_handlers(app)
    # The last one added runs first. Inside metrics, the gate authenticates and holds bodies
    # to their limits before anything reads one (docs/security.md §9); the fast path after it.
    app.add_middleware(ProduceFastPath)
    app.add_middleware(
        RequestGate,
        limits=BodyLimits(message=settings.max_message_bytes, batch=settings.max_batch_bytes),
    )
    app.add_middleware(MetricsMiddleware, metrics=metrics)
    # Outermost: every answer gets them, refusals included (docs/security.md §2).
    app.add_middleware(SecurityHeaders)
    for module in ROUTERS:
        app.include_router(module.router)
    serve_docs(app)
    serve_console(app)
    document_real_errors(app)
    return app


def document_real_errors(app: FastAPI) -> None:
    """Takes FastAPI's automatic 422 out of the OpenAPI document: invalid requests get 400
    in the API's error shape (api/responses.py), and each route documents that itself. And
    documents 413 on every operation with a body: the request gate refuses any body over its
    route's limit (api/gate.py), whatever the route."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = build()
            for operations in document["paths"].values():
                for operation in operations.values():
                    responses = operation.setdefault("responses", {})
                    responses.pop("422", None)
                    if "requestBody" in operation and "413" not in responses:
                        responses["413"] = {
                            "description": "Content Too Large",
                            "content": {
                                "application/json": {
                                    "schema": {"$ref": "#/components/schemas/ErrorOut"}
                                }
                            },
                        }
            schemas = document.get("components", {}).get("schemas", {})
            for unused in ("HTTPValidationError", "ValidationError"):
                schemas.pop(unused, None)
        return app.openapi_schema or build()

    app.openapi = openapi  # type: ignore[method-assign]
