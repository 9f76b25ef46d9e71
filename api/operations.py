"""Operator endpoints of a subscription's delivery (docs/design.md §5): status, group state, dead
letters (browse and unsideline) and seek.

- ``status``: ``lag`` is the records between the consumer group's committed offsets and the
  end of the main log, the retry tiers and the DLQ; ``retry_backlog`` the part of it in retry
  tiers; ``in_flight`` the webhook calls the live workers report; the counters are lifetime
  totals kept in Redis.
- ``dlq/unsideline`` records requests that the worker owning each partition carries out (one
  writer per group): a parked group is delivered again as a whole, in order; a letter
  dead-lettered on its own is delivered again on its own. See :mod:`setu.ordering.dead_letters`.
- ``seek`` works on stopped subscriptions only: it records the time in the metadata store
  (bumping ``seek_generation``); when the subscription starts, each worker taking over a
  partition starts the main log at the first offset at or after that time, once per
  generation (see :mod:`delivery.takeover`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Literal

from confluent_kafka import KafkaException
from fastapi import APIRouter, Depends, Query, Request
from pydantic import Field
from redis.exceptions import RedisError
from starlette.responses import Response

from api import control
from api.auth import allow, authorize, caller
from api.context import blocking, services
from api.health import ingest_state
from api.responses import Out, reply
from api.schemas import Body, errors
from setu import names
from setu.access import Permission, grants
from setu.clock import now_ms
from setu.errors import DependencyUnavailable, InvalidInput, NotFound
from setu.model import Subscription
from setu.names import shown
from setu.ordering.dead_letters import (
    Selector,
)
from setu.ordering.groups import Standing, standing
from setu.ordering.state import GroupState
from setu.ordering.tiers import DLQ, MAIN, is_retry, tier_name, topic_of, topics_by_tier
from setu.partitioner import partition_for
from state.attempt_log import delivery_record
from state.changelog import Keyed
from state.dead_letter_ops import DeadLetterOps
from state.durable_groups import DurableGroupStore
from state.groups import RedisGroupStore
from state.kafka_admin import held_tiers
from state.kafka_reader import Backlog, DeadLetterReader
from state.shared_changelog import SubscriptionChangelog

router = APIRouter(
    dependencies=[Depends(authorize)],
    responses=errors(401, 403),
    prefix="/v1/projects/{project}/subscriptions/{subscription}",
    tags=["operations"],
)


class UnsidelineBody(Body):
    group_ids: list[Annotated[str, Field(min_length=1, max_length=100)]] | None = Field(
        None, max_length=10_000
    )
    message_ids: list[Annotated[str, Field(min_length=1, max_length=100)]] | None = Field(
        None, max_length=10_000
    )
    failed_before: int | None = Field(None, ge=0, description="epoch ms")


class SeekBody(Body):
    timestamp_ms: int = Field(ge=0, le=2**63 - 1)


class IngestOut(Out):
    """The ingest job as it last reported (state.ingest_status); ``lag``: this topic's."""

    state: Literal["unknown", "starting", "running", "failed", "stopped", "down"]
    ok: bool
    since_ms: int | None = None
    offsets_behind: int | None = None
    last_batch_at_ms: int | None = None
    lag: int | None = None
    # Whether the running job reads this topic's ingest topic yet (a new topic is picked up
    # within seconds; until then its messages wait there); null when the job does not say.
    reading_topic: bool | None = None
    error: str | None = None


class PartitionStatusOut(Out):
    partition: int
    # Records not finished in the main log and the retry tiers of this partition index.
    lag: int
    # When the oldest of them was produced (ms); null when none waits.
    oldest_undelivered_ms: int | None


class BreakerStatusOut(Out):
    state: Literal["closed", "open", "half_open"]
    # When it entered that state (ms); for closed with no worker reporting, null.
    since_ms: int | None
    # The last failure it saw (e.g. "HTTP 503", "connection refused").
    last_error: str | None


GroupStateHeld = Literal["ok", "rebuilding"]


class StatusOut(Out):
    state: Literal["running", "paused", "stopped"]
    # Whether Redis holds the group state of every partition ("ok"), or some partition's is
    # being rebuilt from the changelog after Redis forgot it, or waits for a worker to do so
    # ("rebuilding": failed_groups and the group views may show too little meanwhile).
    group_state: GroupStateHeld
    # Why a policy paused it (docs/policies.md §3); null otherwise.
    paused_reason: str | None
    # The endpoint's circuit breaker (docs/policies.md §2), the worst one the live workers
    # report: open over half-open over closed.
    breaker: BreakerStatusOut
    lag: int
    in_flight: int
    failed_groups: int
    # Groups whose head waits for the time its producer chose (docs/scheduling.md), apart
    # from failed_groups: waiting is not a failure.
    scheduled_groups: int
    retry_backlog: int
    dead_lettered: int
    delivered_total: int
    # How long the oldest message not yet delivered (dead letters aside) has waited since it
    # was produced; null when none waits.
    oldest_undelivered_age_ms: int | None
    partitions: list[PartitionStatusOut]
    ingest: IngestOut
    # Since the longest-parked (dead-lettered) group first failed; none of its letters is
    # older. Null when no group is parked.
    oldest_parked_age_ms: int | None
    # Until the DLQ's retention may delete that group's first letter
    # (SETU_DEAD_LETTER_RETENTION_HOURS); null when parked letters are kept for ever.
    parked_expire_in_ms: int | None
    # The same for the longest-retrying group, whose messages wait in the retry tiers (kept
    # for the topic's retention_hours).
    oldest_retrying_age_ms: int | None
    retrying_expire_in_ms: int | None


class GroupOut(Out):
    group_id: str
    # "scheduled": its head waits in the main log for the time its producer chose, its
    # later messages behind it (docs/scheduling.md).
    state: Literal["healthy", "retrying", "dead_lettered", "scheduled"]
    tier: str | None
    parked: int
    head_message_id: str | None
    # When the head is called next: a scheduled head's time, or a retry's (null: at once, or
    # when its tier is read).
    due_at_ms: int | None = None
    # "rebuilding": the group's partition is being rebuilt after Redis forgot it; the state
    # shown may be out of date until it is "ok" again.
    group_state: GroupStateHeld


class UnhealthyGroupOut(GroupOut):
    # When the group became unhealthy (its first failure since it was last healthy).
    since_ms: int


class UnhealthyGroupsOut(Out):
    # "rebuilding": some partition is being rebuilt after Redis forgot it; the list may
    # miss groups until it is "ok" again.
    group_state: GroupStateHeld
    groups: list[UnhealthyGroupOut]
    # The cursor of the next page (pass it as ``after``); null on the last page.
    next: str | None


class AttemptOut(Out):
    attempt: int
    at_ms: int
    tier: str
    outcome: Literal["delivered", "retry", "dead_letter"]
    status: int | None
    error: str | None
    duration_ms: float
    # The start of a failed answer's body (up to 4 KiB), as text; null for a key that may not
    # read message bodies (a receiver may echo the request).
    response_excerpt: str | None
    # False when it failed while the endpoint's circuit breaker was open: the attempt was not
    # counted, and the message was called again with the same attempt number.
    counted: bool
    # A replay's call (docs/replays.md): the replay, and the webhook-id the call had (the
    # message id for live calls).
    replay_id: str | None = None
    webhook_id: str


class MoveOut(Out):
    at_ms: int
    to: str
    why: str


class DeliveryRecordOut(Out):
    message_id: str
    # "delivered", "filtered" (its subscription's filter turned it away, never called),
    # "cancelled" (scheduled, and cancelled by its producer before its time), "gone" (a
    # scheduled message its topic's retention deleted first), or where it waits: "main",
    # "scheduled" (for its time, docs/scheduling.md), "rq.N" or "dlq"
    location: str
    # The time its producer chose, while it is scheduled (docs/scheduling.md).
    deliver_at_ms: int | None = None
    attempts: list[AttemptOut]
    moves: list[MoveOut]


class DeadLetterOut(Out):
    message_id: str
    group_id: str | None
    partition: int
    offset: int
    cursor: str
    failed_at: int | None
    attempts: int
    last_status: int | None
    error: str | None
    parked: bool
    headers: list[list[str]]
    body: str
    body_encoding: Literal["base64"]


class DeadLettersOut(Out):
    messages: list[DeadLetterOut]
    next: str | None


class RequeuedOut(Out):
    requeued: int


class SeekOut(Out):
    state: Literal["running", "paused", "stopped"]
    seek_to_ms: int
    seek_generation: int


async def _subscription(request: Request, project: str, name: str) -> tuple[Subscription, int]:
    """The subscription and its topic's partition count; NotFound when either is unknown."""
    store = services(request).store
    sub = await blocking(store.get_subscription, project, name)
    topic = await blocking(store.get_topic, project, sub.topic)
    return sub, topic.partitions


async def _kafka(call: Any, *args: Any) -> Any:
    try:
        return await blocking(call, *args)
    except (KafkaException, TimeoutError) as exc:
        raise DependencyUnavailable(f"Kafka: {exc}") from exc


@router.get(
    "/status",
    summary="Lag, calls in flight, failed groups, retry backlog and lifetime counters",
    response_model=None,
    responses={200: {"model": StatusOut}, **errors(404, 503)},
)
@allow(Permission.READ)
async def status(request: Request, project: str, subscription: str) -> Response:
    sub, partitions = await _subscription(request, project, subscription)
    topic = await blocking(services(request).store.get_topic, project, sub.topic)
    # A grouped topic's subscriptions have a tier 1 even without retry delays: a held
    # message's group waits there (docs/scheduling.md).
    tiers = held_tiers(sub, topic)
    topics = dict.fromkeys(topics_by_tier(sub, tiers), partitions)
    group = names.consumer_group(project, subscription)
    retry_topics = {topic_of(sub, t) for t in range(1, tiers + 1)}
    waiting = {topic_of(sub, MAIN), *retry_topics}  # dead letters are counted apart
    backlog: list[Backlog] = await _kafka(
        services(request).kafka_reader.backlog, group, topics, waiting
    )
    by_partition = partition_status(backlog, waiting, partitions)
    waited = [p["oldest_undelivered_ms"] for p in by_partition if p["oldest_undelivered_ms"]]
    groups = services(request).redis.groups(project, subscription)
    try:
        held = await held_state(groups, partitions)
        oldest = await groups.oldest_unhealthy()
        failed = await groups.failed_count()
        scheduled = await groups.scheduled_count()
        counters = await groups.counters()
        fresh = await services(request).redis.workers().fresh(project, subscription, now_ms())
    except RedisError as exc:
        raise DependencyUnavailable(f"Redis: {exc}") from exc
    try:
        ingest = await ingest_state(services(request))
    except RedisError as exc:
        raise DependencyUnavailable(f"Redis: {exc}") from exc
    topic_lags = ingest.pop("topic_lags", {})
    reading = ingest.pop("reading_topics", None)
    # The topic's records wait in its ingest topic, or in the shared ingest log (decision 0010),
    # where the lag counts every topic's records.
    ingest_topic = services(request).settings.shared_ingest_log() or names.ingest_topic(
        project, sub.topic
    )
    # Records of this topic the ingest job has still to read (known while it reports)
    ingest["lag"] = topic_lags.get(ingest_topic)
    ingest["reading_topic"] = (
        None if reading is None or not ingest["ok"] else ingest_topic in reading
    )
    if ingest["reading_topic"] is False:
        ingest["error"] = (
            "the ingest job has not picked up this topic yet (it does within seconds of its "
            "creation); its messages wait in the topic's ingest log until then"
        )
    return reply(
        StatusOut,
        {
            "state": sub.state.value,
            "group_state": held,
            "paused_reason": sub.paused_reason,
            "breaker": breaker_status([s.get("breaker") for s in fresh]),
            "lag": sum(b.lag for b in backlog),
            "in_flight": sum(int(s.get("in_flight", 0)) for s in fresh),
            "failed_groups": max(0, failed - scheduled),
            "scheduled_groups": scheduled,
            "retry_backlog": sum(b.lag for b in backlog if b.topic in retry_topics),
            "dead_lettered": counters["dead_lettered"],
            "delivered_total": counters["delivered_total"],
            "oldest_undelivered_age_ms": max(0, now_ms() - min(waited)) if waited else None,
            "partitions": by_partition,
            "ingest": ingest,
            **expiry(
                "parked",
                oldest.get(Standing.DEAD_LETTERED),
                services(request).settings.dead_letter_retention_hours,
            ),
            **expiry("retrying", oldest.get(Standing.RETRYING), topic.retention_hours),
        },
    )


def expiry(standing: str, since_ms: int | None, retention_hours: int | None) -> dict[str, Any]:
    """How old the longest-unhealthy group of a standing is, and how long until retention
    may delete its first message (None: no such group, or kept for ever)."""
    if since_ms is None:
        return {f"oldest_{standing}_age_ms": None, f"{standing}_expire_in_ms": None}
    now = now_ms()
    left = None if retention_hours is None else since_ms + retention_hours * 3_600_000 - now
    return {f"oldest_{standing}_age_ms": max(0, now - since_ms), f"{standing}_expire_in_ms": left}


_BREAKER_RANK = {"closed": 0, "half_open": 1, "open": 2}


def breaker_status(reports: list[Any]) -> dict[str, Any]:
    """The workers' breakers as one: the worst state, and of those the one longest in it."""
    found = [r for r in reports if isinstance(r, dict) and r.get("state") in _BREAKER_RANK]
    if not found:
        return {"state": "closed", "since_ms": None, "last_error": None}
    worst = max(found, key=lambda r: (_BREAKER_RANK[r["state"]], -int(r.get("since_ms") or 0)))
    return {
        "state": worst["state"],
        "since_ms": worst.get("since_ms"),
        "last_error": worst.get("last_error"),
    }


def partition_status(
    backlog: list[Backlog], waiting: set[str], partitions: int
) -> list[dict[str, Any]]:
    """Per partition index: what waits in the main log and the retry tiers, and since when."""
    lag = [0] * partitions
    oldest: list[int | None] = [None] * partitions
    for b in backlog:
        if b.topic not in waiting or b.partition >= partitions:
            continue
        lag[b.partition] += b.lag
        held = oldest[b.partition]
        if b.oldest_ms is not None:
            oldest[b.partition] = b.oldest_ms if held is None else min(held, b.oldest_ms)
    return [
        {"partition": p, "lag": lag[p], "oldest_undelivered_ms": oldest[p]}
        for p in range(partitions)
    ]


async def held_state(groups: RedisGroupStore, partitions: int, only: int | None = None) -> str:
    """``ok`` when Redis holds the group state of every partition (or of partition ``only``),
    else ``rebuilding`` (docs/design.md §4, "Redis may forget")."""
    loaded = await groups.loaded()
    wanted = range(partitions) if only is None else [only]
    return "ok" if all(p in loaded for p in wanted) else "rebuilding"


def group_view(group_id: str, state: GroupState | None, held: str = "ok") -> dict[str, Any]:
    """The API's view of one group's state."""
    if state is None:
        return {
            "group_id": group_id,
            "state": "healthy",
            "tier": None,
            "parked": 0,
            "head_message_id": None,
            "due_at_ms": None,
            "group_state": held,
        }
    kind, tier = standing(state)
    return {
        "group_id": group_id,
        "state": kind.value,
        "tier": tier_name(tier) if tier == DLQ or is_retry(tier) else None,
        "parked": state.parked,
        "head_message_id": state.head,
        "due_at_ms": state.due_at_ms or None,
        "group_state": held,
    }


@router.get(
    "/groups/{group_id}",
    summary="Where a group stands: healthy, retrying in a tier, or parked in the DLQ",
    response_model=None,
    responses={200: {"model": GroupOut}, **errors(404, 503)},
)
@allow(Permission.READ)
async def group(request: Request, project: str, subscription: str, group_id: str) -> Response:
    _, partitions = await _subscription(request, project, subscription)
    groups = services(request).redis.groups(project, subscription)
    try:
        state = await groups.group(group_id)
        held = await held_state(groups, partitions, partition_for(group_id.encode(), partitions))
    except RedisError as exc:
        raise DependencyUnavailable(f"Redis: {exc}") from exc
    return reply(GroupOut, group_view(group_id, state, held))


@router.get(
    "/groups",
    summary="The groups that are not healthy, the longest unhealthy first (paged)",
    response_model=None,
    responses={200: {"model": UnhealthyGroupsOut}, **errors(400, 404, 503)},
)
@allow(Permission.READ)
async def unhealthy_groups(
    request: Request,
    project: str,
    subscription: str,
    state: Annotated[Literal["retrying", "dead_lettered", "scheduled"] | None, Query()] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    after: Annotated[str | None, Query(max_length=200)] = None,
) -> Response:
    _, partitions = await _subscription(request, project, subscription)
    store = services(request).redis.groups(project, subscription)
    try:
        page = await store.unhealthy(
            Standing(state) if state else None, limit, parse_group_cursor(after)
        )
        held = await held_state(store, partitions)
    except RedisError as exc:
        raise DependencyUnavailable(f"Redis: {exc}") from exc
    return reply(
        UnhealthyGroupsOut,
        {
            "group_state": held,
            "groups": [
                {**group_view(g.group_id, g.state, held), "since_ms": g.since_ms}
                for g in page.groups
            ],
            "next": None if page.next is None else f"{page.next[0]}:{page.next[1]}",
        },
    )


@router.get(
    "/messages/{message_id}",
    summary="A message's delivery record: where it is now, each attempt and each move",
    response_model=None,
    responses={200: {"model": DeliveryRecordOut}, **errors(404, 503)},
)
@allow(Permission.READ)
async def message_record(
    request: Request, project: str, subscription: str, message_id: str
) -> Response:
    await _subscription(request, project, subscription)
    hours = services(request).settings.attempt_log_hours
    entries = []
    if hours > 0:
        log_ = services(request).redis.attempt_log(project, subscription, hours)
        try:
            entries = await log_.read(message_id)
        except RedisError as exc:
            raise DependencyUnavailable(f"Redis: {exc}") from exc
    if not entries:
        raise NotFound(
            f"no delivery record of message {shown(message_id)} in the last {hours} h "
            "(unknown, not attempted yet, or older: SETU_ATTEMPT_LOG_HOURS)"
        )
    record = delivery_record(message_id, entries)
    if Permission.READ_BODIES not in grants(caller(request).role):
        # A receiver may echo the request in its answer: the excerpt is a body, and this key
        # may not read bodies (docs/security.md §2).
        for attempt in record["attempts"]:
            attempt["response_excerpt"] = None
    return reply(DeliveryRecordOut, record)


def parse_group_cursor(after: str | None) -> tuple[int, str] | None:
    """``since_ms:group_id`` as the previous page's ``next`` gave it."""
    if after is None:
        return None
    since, _, group = after.partition(":")
    if not since.isascii() or not since.isdigit() or not group:
        raise InvalidInput(f"cursor {after!r} is not one that 'next' gave")
    return int(since), group


async def _dead_letter_ops(request: Request, sub: Subscription, partitions: int) -> DeadLetterOps:
    """Browsing and unsideline; a release request goes to the changelog of the subscription's
    topic before Redis, so a Redis that forgets does not forget it (state/durable_groups.py)."""
    s = services(request)
    made: list[bool] = []

    async def send(topic: str, partition: int, records: Sequence[Keyed]) -> object:
        if not made:
            # A topic from before shared changelogs may have none yet: a broker that creates
            # topics on first write would make it with the wrong partition count.
            shape = await blocking(s.store.get_topic, sub.project, sub.topic)
            await blocking(s.kafka_admin.ensure_groups, shape)
            made.append(True)
        await s.producer.send_to(topic, partition, records)
        return None

    changelog = SubscriptionChangelog(names.groups_topic(sub.project, sub.topic), sub.name, send)
    store = DurableGroupStore(services(request).redis.groups(sub.project, sub.name), changelog)
    return DeadLetterOps(
        store, DeadLetterReader(services(request).kafka_reader, topic_of(sub, DLQ)), partitions
    )


@router.get(
    "/dlq/messages",
    summary="Browse dead letters (oldest first per partition; cursor in 'next')",
    response_model=None,
    responses={200: {"model": DeadLettersOut}, **errors(400, 404, 503)},
)
@allow(Permission.READ_BODIES)
async def dead_letters(
    request: Request,
    project: str,
    subscription: str,
    group_id: Annotated[str | None, Query(max_length=100)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    after: Annotated[str | None, Query(max_length=64)] = None,
) -> Response:
    sub, partitions = await _subscription(request, project, subscription)
    ops = await _dead_letter_ops(request, sub, partitions)
    try:
        page = await ops.browse(group_id, limit, after)
    except ValueError as exc:
        raise InvalidInput(str(exc)) from None
    except RedisError as exc:
        raise DependencyUnavailable(f"Redis: {exc}") from exc
    except (KafkaException, TimeoutError) as exc:
        raise DependencyUnavailable(f"Kafka: {exc}") from exc
    views = [letter.view(state) for letter, state in page.letters]
    return reply(DeadLettersOut, {"messages": views, "next": page.next_cursor})


@router.post(
    "/dlq/unsideline",
    summary="Deliver dead letters again, in order (by group ids, message ids or failed_before)",
    response_model=None,
    responses={200: {"model": RequeuedOut}, **errors(400, 404, 503)},
)
@allow(Permission.OPERATE)
async def unsideline(
    request: Request, project: str, subscription: str, body: UnsidelineBody
) -> Response:
    given = [x for x in (body.group_ids, body.message_ids, body.failed_before) if x is not None]
    if len(given) != 1:
        raise InvalidInput("give exactly one of group_ids, message_ids or failed_before")
    sub, partitions = await _subscription(request, project, subscription)
    selector = Selector(
        group_ids=frozenset(body.group_ids) if body.group_ids is not None else None,
        message_ids=frozenset(body.message_ids) if body.message_ids is not None else None,
        failed_before=body.failed_before,
    )
    ops = await _dead_letter_ops(request, sub, partitions)
    try:
        releases = await ops.release(selector)
    except RedisError as exc:
        raise DependencyUnavailable(f"Redis: {exc}") from exc
    except (KafkaException, TimeoutError) as exc:
        raise DependencyUnavailable(f"Kafka: {exc}") from exc
    return reply(RequeuedOut, {"requeued": releases.requeued})


@router.post(
    "/seek",
    summary="Start the main log at a time when the stopped subscription starts again",
    response_model=None,
    responses={200: {"model": SeekOut}, **errors(400, 404, 409)},
)
@allow(Permission.OPERATE)
async def seek(request: Request, project: str, subscription: str, body: SeekBody) -> Response:
    s = services(request)
    sub = await blocking(s.store.request_seek, project, subscription, body.timestamp_ms)
    await control.announce(s)
    return reply(
        SeekOut,
        {
            "state": sub.state.value,
            "seek_to_ms": sub.seek_to_ms,
            "seek_generation": sub.seek_generation,
        },
    )
