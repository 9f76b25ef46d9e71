"""Cancelling a scheduled message (docs/scheduling.md, docs/design.md §5).

A producer that scheduled a message (``X_DELIVER_AT`` or ``X_DELIVER_AFTER_MS``) may cancel it
before its time: the cancel is recorded in the metadata database, and the worker holding the
message in each subscription asks there when the time comes, before the first call. So a
cancel answered before the message's time holds for every subscription; one after its time
may find it delivered (``GET .../subscriptions/{s}/messages/{id}`` tells, per subscription).
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from starlette.responses import Response

from api.auth import allow, authorize
from api.context import blocking, services
from api.messages import schedule_limit_ms
from api.responses import Out, reply
from api.schemas import errors
from setu import headers as rules
from setu.access import Permission
from setu.clock import now_ms
from setu.errors import InvalidInput

router = APIRouter(
    dependencies=[Depends(authorize)],
    responses=errors(401, 403),
    prefix="/v1/projects/{project}/topics/{topic}/messages",
    tags=["produce"],
)

# A cancel is kept this long past the latest time its message could be due.
KEEP_PAST_DUE_MS = 3_600_000


class CancelOut(Out):
    message_id: str
    # When it was first cancelled (a second cancel answers the first one's time).
    cancelled_at_ms: int


@router.post(
    "/{message_id}/cancel",
    response_model=None,
    summary="Cancel a scheduled message before its time",
    responses={200: {"model": CancelOut}, **errors(400, 404, 503)},
)
@allow(Permission.PRODUCE)
async def cancel(request: Request, project: str, topic: str, message_id: str) -> Response:
    s = services(request)
    rules.check_id(rules.MESSAGE_ID, message_id, required=True)
    found = await blocking(s.store.get_topic, project, topic)  # 404 for none
    if not found.grouped:
        raise InvalidInput(f"topic {topic!r} is not grouped: nothing on it can be scheduled")
    limit = schedule_limit_ms(found, s.settings.max_delivery_delay_ms)
    now = now_ms()
    at = await blocking(
        s.store.schedule_cancels.cancel,
        project,
        topic,
        message_id,
        now,
        now + limit + KEEP_PAST_DUE_MS,
    )
    return reply(CancelOut, {"message_id": message_id, "cancelled_at_ms": at})
