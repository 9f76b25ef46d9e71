"""Where a project's operational events go: ``/v1/projects/{project}/notifications``
(docs/design.md §10, docs/policies.md §4).

PUT sets the endpoint (checked against the SSRF rule as a subscription's is) and the events
it wants; its signing secret is write-only like a subscription's, kept when a PUT leaves it
out and removed by null. GET shows it without the secret; DELETE removes it.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from starlette.responses import Response

from api import control
from api.auth import allow, authorize
from api.context import blocking, services
from api.responses import reply
from api.schemas import NotificationsBody, NotificationsOut, errors
from api.validation import check_signing_secret
from setu.access import Permission
from setu.errors import InvalidInput, NotFound
from setu.model import Notifications

router = APIRouter(
    dependencies=[Depends(authorize)],
    responses=errors(401, 403),
    prefix="/v1/projects/{project}/notifications",
    tags=["notifications"],
)


def notifications_view(n: Notifications) -> dict[str, Any]:
    return {
        "project": n.project,
        "url": n.url,
        "events": list(n.events),
        "has_signing_secret": n.signing_secret is not None,
        "updated_at_ms": n.updated_at_ms,
    }


@router.put(
    "",
    response_model=None,
    summary="Set where the project's operational events go",
    responses={200: {"model": NotificationsOut}, **errors(400, 404, 503)},
)
@allow(Permission.MANAGE)
async def set_notifications(request: Request, project: str, body: NotificationsBody) -> Response:
    s = services(request)
    if len(set(body.events)) != len(body.events):
        raise InvalidInput("events: each event type at most once")
    await control.check_endpoint(s, body.url)
    secret = body.signing_secret
    if "signing_secret" not in body.model_fields_set:
        try:
            current = await blocking(s.store.get_notifications, project)
            secret = current.signing_secret
        except NotFound:
            secret = None
    elif secret is not None:
        check_signing_secret(secret)
    stored = await blocking(
        s.store.set_notifications, Notifications(project, body.url, tuple(body.events), secret)
    )
    return reply(NotificationsOut, notifications_view(stored))


@router.get(
    "",
    response_model=None,
    summary="Where the project's operational events go",
    responses={200: {"model": NotificationsOut}, **errors(404)},
)
@allow(Permission.READ)
async def get_notifications(request: Request, project: str) -> Response:
    found = await blocking(services(request).store.get_notifications, project)
    return reply(NotificationsOut, notifications_view(found))


@router.delete(
    "",
    status_code=204,
    response_model=None,
    summary="Stop sending the project's operational events",
    responses=errors(404),
)
@allow(Permission.MANAGE)
async def delete_notifications(request: Request, project: str) -> Response:
    await blocking(services(request).store.delete_notifications, project)
    return Response(status_code=204)
