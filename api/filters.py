"""``POST /v1/projects/{project}/filters/test``: whether a filter (docs/policies.md §1) lets a
sample message through, judged exactly as delivery judges a message (``setu.policies``). It
reads and writes nothing of the project, so a viewer may call it."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from starlette.responses import Response

from api.auth import allow, authorize
from api.context import blocking, services
from api.messages import producer_headers, sample_body
from api.responses import reply
from api.schemas import FilterTestBody, FilterTestOut, errors
from setu.access import Permission
from setu.envelope import Envelope
from setu.policies import accepts, parse_filter

router = APIRouter(
    dependencies=[Depends(authorize)],
    responses=errors(401, 403),
    prefix="/v1/projects/{project}/filters",
    tags=["filters"],
)


@router.post(
    "/test",
    response_model=None,
    summary="Whether a filter lets a sample message through",
    responses={200: {"model": FilterTestOut}, **errors(400, 404)},
)
@allow(Permission.READ)
async def test_filter(request: Request, project: str, body: FilterTestBody) -> Response:
    await blocking(services(request).store.get_project, project)  # 404 for none
    given = parse_filter(body.filter)
    sample = Envelope(
        "sample",
        sample_body({"body": body.body, "body_base64": body.body_base64}),
        group_id=body.group_id,
        headers=producer_headers(body.headers),
    )
    return reply(FilterTestOut, {"matches": accepts(given, sample)})
