"""The objects a request handler works with, opened in the app's lifespan.

Routes reach them through :func:`services` only. ``app.state.store`` is kept for tests that
look at the metadata store behind the API.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ParamSpec, TypeVar, cast

from fastapi import Request
from starlette.concurrency import run_in_threadpool

from api.auth import Authenticator
from api.metrics import ApiMetrics
from api.producer import AckedProducer
from api.provisioning import Provisioning
from api.quotas import ProjectQuotas, QuotaGate
from api.topic_cache import TopicCache
from setu.addresses import Resolver, system_resolver
from setu.settings import Settings
from state.kafka_admin import KafkaTopics
from state.kafka_reader import KafkaReader
from state.metadata import MetadataStore
from state.redis_state import RedisState
from state.retired_topics import RetiredList

P = ParamSpec("P")
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Services:
    settings: Settings
    store: MetadataStore
    # Every Redis adapter a route needs, on the process's one client.
    redis: RedisState
    retired: RetiredList
    kafka_admin: KafkaTopics
    # Short reads outside any consumer group: lag, DLQ pages, what reject topics hold.
    kafka_reader: KafkaReader
    producer: AckedProducer
    topics: TopicCache
    metrics: ApiMetrics
    auth: Authenticator
    quotas: ProjectQuotas
    gate: QuotaGate
    # Makes new subscriptions' Kafka topics after their create is answered (api/provisioning.py).
    provisioning: Provisioning
    # How webhook hosts are resolved when a subscription is written (docs/security.md §4).
    resolver: Resolver = system_resolver


def services(request: Request) -> Services:
    return cast(Services, request.app.state.services)


async def blocking(func: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """Runs a blocking store or admin call in the thread pool, off the event loop."""
    return await run_in_threadpool(func, *args, **kwargs)
