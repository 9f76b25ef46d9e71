"""The control plane's multi-step operations, ordered so that a failure at any step leaves a
state that repeating the request repairs.

- Create a topic: check the store first (an equal record returns at once, a different one is
  a 409 before Kafka is touched), ensure the Kafka topics (idempotent), then insert the row. A
  crash after the Kafka step leaves topics that the retried create adopts.
- Create a subscription: check the store, insert the row, answer; its Kafka topics are made
  in the background (api/provisioning.py) and by each worker before it runs the subscription,
  so a failure or crash there loses nothing (docs/delivery.md, "A new subscription").
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
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from confluent_kafka import KafkaException
from redis.exceptions import RedisError

from api.context import Services, blocking
from api.validation import check_grouping, check_update, endpoint_host, refuse_private
from setu import names
from setu.addresses import IPAddress, Resolver
from setu.clock import now_ms
from setu.errors import Conflict, DependencyUnavailable, InvalidInput
from setu.model import Subscription, Topic
from setu.names import shown
from state.redis_state import RedisState
from state.shared_changelog import clear_subscription, read_from

log = logging.getLogger(__name__)

_RESOLVE_TIMEOUT_S = 2.0
# How long a delete waits for the workers to stop its subscription's runners (they drain their
# calls in flight, commit and report: seconds).
DELETE_WAIT_S = 30.0


async def create_topic(s: Services, topic: Topic) -> tuple[Topic, bool]:
    existing = await blocking(s.store.preflight_topic, topic)
    made = await blocking(s.kafka_admin.ensure_topic, existing or topic)
    if existing is not None:
        return existing, False
    async with undone_on_failure(s, made):
        return await _insert_topic(s, topic)


async def _insert_topic(s: Services, topic: Topic) -> tuple[Topic, bool]:
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


async def resolve(resolver: Resolver, host: str) -> list[IPAddress]:
    """Addresses ``host`` resolves to now; empty when it does not resolve in time."""
    try:
        answers = await asyncio.wait_for(resolver(host, 443), _RESOLVE_TIMEOUT_S)
    except (OSError, TimeoutError, UnicodeError):
        return []
    addresses: list[IPAddress] = []
    for answer in answers:
        try:
            addresses.append(ipaddress.ip_address(answer.split("%", 1)[0]))
        except ValueError:
            continue
    return addresses


async def check_endpoint(s: Services, url: str, field: str = "endpoint.url") -> None:
    """Refuses private and loopback webhooks unless settings allow them, and hosts that do not
    resolve within 2 s: a check that cannot be made fails closed (docs/security.md §4).
    ``field`` names the URL in errors (an OAuth2 token URL is checked the same way)."""
    host = endpoint_host(url, field)
    if s.settings.allow_private_endpoints:
        return
    refuse_private(host, [], allow_private=False, field=field)  # literals and local names
    resolved = await resolve(s.resolver, host)
    if not resolved:
        raise InvalidInput(
            f"{field} host {shown(host)} does not resolve (within "
            f"{_RESOLVE_TIMEOUT_S:g} s); use a name with a public DNS record"
        )
    refuse_private(host, resolved, allow_private=False, field=field)


async def create_subscription(s: Services, sub: Subscription) -> tuple[Subscription, bool]:
    topic = await blocking(s.store.get_topic, sub.project, sub.topic)
    check_grouping(sub.grouped, topic)
    existing = await blocking(s.store.preflight_subscription, sub)
    if existing is not None:
        s.provisioning.start(existing)  # a retry after a crash finds its topics made
        return existing, False
    created = await blocking(s.store.create_subscription, sub)
    # Its Kafka topics are made after the answer (api/provisioning.py), then its ``born``
    # records: nothing was ever committed in its group.
    s.provisioning.start(created[0], born_partitions=topic.partitions)
    try:
        # A new subscription has no group state to rebuild (docs/design.md §4).
        await s.redis.groups(sub.project, sub.name).mark_loaded(range(topic.partitions))
    except RedisError as exc:  # its views say "rebuilding" until a worker takes it over
        log.warning(
            "subscription %s/%s: could not mark its state loaded: %s", sub.project, sub.name, exc
        )
    await announce(s)
    return created


async def announce(s: Services) -> None:
    """Tells the delivery workers a subscription changed, so they act on it within a second
    instead of at their next listing; without Redis they still do at that listing."""
    try:
        await s.redis.announce_subscriptions()
    except RedisError as exc:
        log.warning("could not tell the workers of a subscription's change: %s", exc)


async def update_subscription(s: Services, sub: Subscription, version: int) -> Subscription:
    current = await blocking(s.store.get_subscription, sub.project, sub.name)
    if current.version != version:
        raise Conflict(
            f"subscription {sub.name!r} is at version {current.version}, not {version}; "
            "read it again and retry"
        )
    check_update(current, sub)
    # More retry tiers are made at the first copy there, as the first ones are (decision 0014).
    updated = await blocking(s.store.update_subscription, sub, version)
    await announce(s)
    return updated


@asynccontextmanager
async def undone_on_failure(s: Services, made: list[str]) -> AsyncIterator[None]:
    """Deletes the Kafka topics a create just made when its database write then
    fails, so a failed request leaves nothing behind. The failure is raised as it was; a
    failed clean-up is logged (a repeated request adopts what is left).

    A Conflict keeps them: a concurrent request wrote a record of the same name, and the
    topics are now its topics."""
    try:
        yield
    except Conflict:
        raise
    except BaseException:
        if made:
            try:
                await blocking(s.kafka_admin.remove, made)
            except Exception:
                log.exception("could not remove Kafka topics %s of a failed request", made)
            else:
                log.info("removed Kafka topics %s of a failed request", made)
        raise


async def delete_subscription(s: Services, project: str, name: str) -> None:
    sub = await blocking(s.store.mark_subscription_deleting, project, name)
    await announce(s)
    # Topics still being made for it would outlive the delete.
    await s.provisioning.settled(project, name)
    await runners_stopped(s, project, name)
    await blocking(s.kafka_admin.delete_subscription, project, name)
    await clear_shared_changelog(s, sub)
    await clear_subscription_state(s.redis, project, name)
    await blocking(s.store.delete_subscription, project, name)


async def runners_stopped(s: Services, project: str, name: str) -> None:
    """Returns once no worker reports running the subscription (a runner's last report goes
    after its last commit): a runner's offsets or group state written after the delete
    removed them would be inherited by a subscription made again under its name. Conflict
    after :data:`DELETE_WAIT_S`; the delete may be repeated."""
    workers = s.redis.workers()
    deadline = time.monotonic() + DELETE_WAIT_S
    while True:
        try:
            running = await workers.fresh_by_worker(project, name, now_ms())
        except RedisError as exc:
            raise DependencyUnavailable(f"Redis: {exc}") from exc
        if not running:
            return
        if time.monotonic() > deadline:
            raise Conflict(
                f"workers {sorted(running)} still run subscription {shown(name)}; they stop "
                "once they see the deletion, so repeat the DELETE shortly"
            )
        await asyncio.sleep(0.2)


async def clear_shared_changelog(s: Services, sub: Subscription) -> None:
    """Removes the subscription's records from its topic's group-state changelog
    (state/shared_changelog.py); nothing when the topic has none (one from before it)."""
    changelog = names.groups_topic(sub.project, sub.topic)
    partitions = await blocking(s.kafka_admin.partition_count, changelog)
    if partitions is None:
        return
    try:
        removed = await clear_subscription(
            changelog,
            partitions,
            sub.name,
            s.producer.send_to,
            read_from(lambda starts: blocking(s.kafka_reader.tails, starts)),
        )
    except (KafkaException, TimeoutError) as exc:
        raise DependencyUnavailable(f"Kafka: {exc}") from exc
    log.info("removed %d changelog keys of subscription %s/%s", removed, sub.project, sub.name)


async def clear_subscription_state(redis: RedisState, project: str, subscription: str) -> int:
    """Deletes every Redis key of the subscription; returns how many there were."""
    try:
        removed = await redis.groups(project, subscription).clear()
    except RedisError as exc:
        raise DependencyUnavailable(f"Redis: {exc}") from exc
    if removed:
        log.info("removed %d Redis keys of subscription %s/%s", removed, project, subscription)
    return removed
