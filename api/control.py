"""The control plane's multi-step operations, ordered so that a failure at any step leaves a
state that repeating the request repairs.

- Create: check the store first (an equal record returns at once, a different one is a 409
  before Kafka is touched), ensure the Kafka topics (idempotent), then insert the row. A crash
  after the Kafka step leaves topics that the retried create adopts.
- Delete: mark the row deleting (it vanishes from reads and from the workers' polling), remove
  the Kafka side (consumer group, then topics; a topic's ingest topic is emptied and kept, see
  ``state.retired_topics``), then Redis state, and only then the row. A crash in between leaves
  a marked row that a repeated DELETE finishes; a re-create of the same name never sees stale
  topics, messages or group state.

Store and admin calls block, so each runs in the thread pool.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket

from redis.asyncio import Redis
from redis.exceptions import RedisError

from api.context import Services, blocking
from api.validation import check_grouping, check_update, endpoint_host, refuse_private
from setu import names
from setu.addresses import IPAddress
from setu.errors import Conflict, DependencyUnavailable
from setu.model import Subscription, Topic
from state.groups import RedisGroupStore

log = logging.getLogger(__name__)

_RESOLVE_TIMEOUT_S = 2.0


async def create_topic(s: Services, topic: Topic) -> tuple[Topic, bool]:
    existing = await blocking(s.store.preflight_topic, topic)
    await blocking(s.kafka_admin.ensure_topic, existing or topic)
    if existing is not None:
        return existing, False
    # A topic created again under a deleted one's name continues its kept ingest topic:
    # emptied of what reached it since (produces to the deleted topic), then no longer
    # skipped by the ingest job, before the topic can take messages (state.retired_topics).
    ingest = names.ingest_topic(topic.project, topic.name)
    if await s.retired.is_retired(ingest):
        await blocking(s.kafka_admin.empty, ingest)
        await s.retired.reopen(ingest)
    created = await blocking(s.store.create_topic, topic)
    s.topics.invalidate(topic.project, topic.name)
    return created


async def delete_topic(s: Services, project: str, name: str) -> None:
    topic = await blocking(s.store.mark_topic_deleting, project, name)
    s.topics.invalidate(project, name)
    # The ingest job skips the topic's records from its next batch on; the ingest topic is
    # then emptied and kept (state.retired_topics).
    await s.retired.retire(names.ingest_topic(project, name))
    await blocking(s.kafka_admin.delete_topic, topic)
    await blocking(s.store.delete_topic, project, name)
    s.topics.invalidate(project, name)


async def resolve(host: str) -> list[IPAddress]:
    """Addresses ``host`` resolves to now; empty when it does not resolve (yet) in time."""
    try:
        infos = await asyncio.wait_for(
            asyncio.get_running_loop().getaddrinfo(host, None, type=socket.SOCK_STREAM),
            _RESOLVE_TIMEOUT_S,
        )
    except (OSError, TimeoutError):
        return []
    addresses: list[IPAddress] = []
    for info in infos:
        try:
            addresses.append(ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]))
        except ValueError:
            continue
    return addresses


async def check_endpoint(s: Services, url: str) -> None:
    """Refuses private and loopback webhooks unless settings allow them (docs/design.md §6)."""
    host = endpoint_host(url)
    if s.settings.allow_private_endpoints:
        return
    refuse_private(host, await resolve(host), allow_private=False)


async def create_subscription(s: Services, sub: Subscription) -> tuple[Subscription, bool]:
    topic = await blocking(s.store.get_topic, sub.project, sub.topic)
    check_grouping(sub.grouped, topic)
    existing = await blocking(s.store.preflight_subscription, sub)
    await blocking(s.kafka_admin.ensure_subscription, existing or sub, topic)
    if existing is not None:
        return existing, False
    return await blocking(s.store.create_subscription, sub)


async def update_subscription(s: Services, sub: Subscription, version: int) -> Subscription:
    current = await blocking(s.store.get_subscription, sub.project, sub.name)
    if current.version != version:
        raise Conflict(
            f"subscription {sub.name!r} is at version {current.version}, not {version}; "
            "read it again and retry"
        )
    check_update(current, sub)
    topic = await blocking(s.store.get_topic, sub.project, sub.topic)
    # More retry tiers need their topics before any worker may move a message there.
    await blocking(s.kafka_admin.ensure_subscription, sub, topic)
    return await blocking(s.store.update_subscription, sub, version)


async def delete_subscription(s: Services, project: str, name: str) -> None:
    await blocking(s.store.mark_subscription_deleting, project, name)
    await blocking(s.kafka_admin.delete_subscription, project, name)
    await clear_subscription_state(s.redis, project, name)
    await blocking(s.store.delete_subscription, project, name)


async def clear_subscription_state(redis: Redis[bytes], project: str, subscription: str) -> int:
    """Deletes every Redis key of the subscription; returns how many there were."""
    try:
        removed = await RedisGroupStore(redis, project, subscription).clear()
    except RedisError as exc:
        raise DependencyUnavailable(f"Redis: {exc}") from exc
    if removed:
        log.info("removed %d Redis keys of subscription %s/%s", removed, project, subscription)
    return removed
