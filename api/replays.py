"""Replays of a subscription (docs/replays.md, docs/design.md §5): deliver again what a time
window, some groups or some messages already delivered.

The API records the replay (``state.replays``) and tells the delivery workers; the worker
owning each partition of the subscription carries it out and records its progress
(``delivery/replaying.py``), which ``GET`` sums up. A cancel ends it within a second.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query, Request
from pydantic import Field
from starlette.responses import Response

from api import control
from api.auth import allow, authorize
from api.context import blocking, services
from api.responses import Out, reply
from api.schemas import Body, errors
from setu.access import Permission
from setu.clock import now_ms
from setu.errors import Conflict, InvalidInput
from setu.model import SubscriptionState
from setu.policies import parse_filter
from setu.replay import PartitionProgress, Replay, new_replay_id, progress_view

router = APIRouter(
    dependencies=[Depends(authorize)],
    responses=errors(401, 403),
    prefix="/v1/projects/{project}/subscriptions/{subscription}/replays",
    tags=["replays"],
)

Id = Annotated[str, Field(min_length=1, max_length=100)]


class ReplayBody(Body):
    from_ms: int = Field(ge=0, le=2**63 - 1, description="epoch ms: produced at or after")
    to_ms: int | None = Field(
        None, ge=0, le=2**63 - 1, description="epoch ms: produced at or before (default: now)"
    )
    group_ids: list[Id] | None = Field(None, min_length=1, max_length=10_000)
    message_ids: list[Id] | None = Field(None, min_length=1, max_length=10_000)
    filter: dict[str, Any] | None = Field(
        None, description="a filter as a subscription's (docs/design.md §10)"
    )
    rate_per_second: float | None = Field(
        None, gt=0, description="calls per second over all partitions"
    )


class ReplayProgressOut(Out):
    scanned: int
    matched: int
    delivered: int
    failed: int
    skipped: int
    waiting_groups: int
    waiting_group_ids: list[str]
    failed_group_ids: list[str]
    failed_message_ids: list[str]
    partitions: int
    partitions_started: int
    partitions_done: int


class ReplayOut(Out):
    id: str
    state: Literal["running", "cancelled", "done"]
    from_ms: int
    to_ms: int
    group_ids: list[str] | None
    message_ids: list[str] | None
    filter: dict[str, Any] | None
    rate_per_second: float
    created_at_ms: int
    ended_at_ms: int | None
    progress: ReplayProgressOut


class ReplaysOut(Out):
    replays: list[ReplayOut]


def _view(replay: Replay, parts: dict[int, PartitionProgress]) -> dict[str, Any]:
    return {
        "id": replay.id,
        "state": replay.state.value,
        **replay.spec_json(),
        "created_at_ms": replay.created_at_ms,
        "ended_at_ms": replay.ended_at_ms,
        "progress": progress_view(replay, parts),
    }


@router.post(
    "",
    status_code=202,
    response_model=None,
    summary="Deliver again the messages of a time window (some groups, some messages, a filter)",
    responses={202: {"model": ReplayOut}, **errors(400, 404, 409, 503)},
)
@allow(Permission.OPERATE)
async def create_replay(
    request: Request, project: str, subscription: str, body: ReplayBody
) -> Response:
    s = services(request)
    now = now_ms()
    if body.from_ms > now:
        raise InvalidInput("from_ms is in the future; nothing was produced then yet")
    to_ms = now if body.to_ms is None else body.to_ms
    if to_ms < body.from_ms:
        raise InvalidInput("to_ms must not be before from_ms")
    limit = s.settings.replay_max_rate_per_second
    rate = (
        s.settings.replay_rate_per_second if body.rate_per_second is None else body.rate_per_second
    )
    if rate > limit:
        raise InvalidInput(
            f"rate_per_second must be at most {limit:g} (SETU_REPLAY_MAX_RATE_PER_SECOND)"
        )
    shape = None if body.filter is None else parse_filter(body.filter)
    sub = await blocking(s.store.get_subscription, project, subscription)
    if sub.state is SubscriptionState.STOPPED:
        raise Conflict(
            f"subscription {subscription!r} is stopped; start it to replay "
            "(or seek, which moves the whole subscription)"
        )
    topic = await blocking(s.store.get_topic, project, sub.topic)
    replay = Replay(
        id=new_replay_id(),
        project=project,
        subscription=subscription,
        from_ms=body.from_ms,
        to_ms=to_ms,
        partitions=topic.partitions,
        rate_per_second=rate,
        created_at_ms=now,
        group_ids=None if body.group_ids is None else frozenset(body.group_ids),
        message_ids=None if body.message_ids is None else frozenset(body.message_ids),
        filter=shape,
    )
    await blocking(s.store.replays.create, replay, s.settings.replays_running_max)
    await control.announce(s)
    return reply(ReplayOut, _view(replay, {}), status_code=202)


@router.get(
    "",
    response_model=None,
    summary="The subscription's replays, newest first",
    responses={200: {"model": ReplaysOut}, **errors(400, 404, 503)},
)
@allow(Permission.READ)
async def list_replays(
    request: Request,
    project: str,
    subscription: str,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
) -> Response:
    s = services(request)
    await blocking(s.store.get_subscription, project, subscription)  # 404 for none
    found = await blocking(s.store.replays.listed, project, subscription, limit)
    return reply(ReplaysOut, {"replays": [_view(r, parts) for r, parts in found]})


@router.get(
    "/{replay_id}",
    response_model=None,
    summary="A replay and its progress",
    responses={200: {"model": ReplayOut}, **errors(404, 503)},
)
@allow(Permission.READ)
async def get_replay(request: Request, project: str, subscription: str, replay_id: str) -> Response:
    replay, parts = await blocking(
        services(request).store.replays.get, project, subscription, replay_id
    )
    return reply(ReplayOut, _view(replay, parts))


@router.post(
    "/{replay_id}/cancel",
    response_model=None,
    summary="Stop a running replay (calls already made stay made)",
    responses={200: {"model": ReplayOut}, **errors(404, 409, 503)},
)
@allow(Permission.OPERATE)
async def cancel_replay(
    request: Request, project: str, subscription: str, replay_id: str
) -> Response:
    s = services(request)
    await blocking(s.store.replays.cancel, project, subscription, replay_id)
    await control.announce(s)
    replay, parts = await blocking(s.store.replays.get, project, subscription, replay_id)
    return reply(ReplayOut, _view(replay, parts))
