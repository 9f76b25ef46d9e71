"""Projects: ``/v1/projects`` (docs/design.md §5). A project may be deleted only when it is
empty."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from starlette.responses import Response

from api.auth import allow, authorize, caller
from api.context import blocking, services
from api.responses import reply
from api.schemas import (
    ProjectCreate,
    ProjectOut,
    ProjectsOut,
    QuotaBody,
    errors,
    project_view,
)
from setu.access import Permission
from setu.model import Project
from setu.names import validate_name

router = APIRouter(
    dependencies=[Depends(authorize)],
    responses=errors(401, 403),
    prefix="/v1/projects",
    tags=["projects"],
)


@router.post(
    "",
    status_code=201,
    response_model=None,
    summary="Create a project (the same body again: 200, a different one: 409)",
    responses={201: {"model": ProjectOut}, 200: {"model": ProjectOut}, **errors(400, 409)},
)
@allow(Permission.ADMIN)
async def create_project(request: Request, body: ProjectCreate) -> Response:
    project = Project(
        name=validate_name("project", body.name),
        description=body.description,
        quota=body.quota.quota(),
    )
    stored, created = await blocking(services(request).store.create_project, project)
    return reply(ProjectOut, project_view(stored), 201 if created else 200)


@router.get("", response_model=None, responses={200: {"model": ProjectsOut}})
@allow(Permission.SIGNED_IN)
async def list_projects(request: Request) -> Response:
    """The projects the caller's key is for: every one for an admin key."""
    who = caller(request)
    found = await blocking(services(request).store.list_projects)
    return reply(ProjectsOut, {"projects": [project_view(p) for p in found if who.sees(p.name)]})


@router.get(
    "/{project}", response_model=None, responses={200: {"model": ProjectOut}, **errors(404)}
)
@allow(Permission.READ)
async def get_project(request: Request, project: str) -> Response:
    found = await blocking(services(request).store.get_project, project)
    return reply(ProjectOut, project_view(found))


@router.put(
    "/{project}/quota",
    response_model=None,
    summary="Set the project's produce quota (messages/s and bytes/s over all API replicas)",
    responses={200: {"model": ProjectOut}, **errors(400, 404)},
)
@allow(Permission.ADMIN)
async def set_quota(request: Request, project: str, body: QuotaBody) -> Response:
    s = services(request)
    updated = await blocking(s.store.set_project_quota, project, body.quota())
    s.quotas.invalidate(project)
    return reply(ProjectOut, project_view(updated))


@router.delete(
    "/{project}",
    status_code=204,
    response_model=None,
    summary="Delete an empty project (409 while it has topics)",
    responses=errors(404, 409),
)
@allow(Permission.ADMIN)
async def delete_project(request: Request, project: str) -> Response:
    await blocking(services(request).store.delete_project, project)
    return Response(status_code=204)
