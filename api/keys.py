"""API keys: ``/v1/keys`` (admin) and ``/v1/projects/{project}/keys`` (docs/security.md).

A key is shown once, in the answer that creates it; afterwards only its id, name, role, scope,
expiry and last use. Revoking takes effect here at once and on every other API replica within
the authenticator's cache time (2 s).
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from starlette.responses import Response

from api.auth import allow, authorize
from api.context import blocking, services
from api.responses import reply
from api.schemas import AnyKeyCreate, KeyCreate, KeyCreatedOut, KeysOut, errors, key_view
from setu.access import ApiKey, Permission, Role, new_token
from setu.access import digest as token_digest
from setu.clock import now_ms
from setu.errors import InvalidInput
from setu.names import validate_name

router = APIRouter(dependencies=[Depends(authorize)], responses=errors(401, 403), tags=["keys"])

_PROJECT_KEYS = "/v1/projects/{project}/keys"


async def _create(
    request: Request,
    project: str | None,
    body: KeyCreate | AnyKeyCreate,
) -> Response:
    role = Role(body.role)
    name = body.name
    if not name.isprintable() or name != name.strip():
        raise InvalidInput("name: printable characters, without spaces at either end")
    if role is Role.ADMIN and project is not None:
        raise InvalidInput("project: an admin key is for every project; leave it out")
    if role is not Role.ADMIN and project is None:
        raise InvalidInput(f"project: a {role} key is for one project; name it")
    if body.topics is not None and role is not Role.PRODUCER:
        raise InvalidInput("topics: only a producer key can be limited to topics")
    now = now_ms()
    if body.expires_at_ms is not None and body.expires_at_ms <= now:
        raise InvalidInput("expires_at_ms: must be in the future")
    s = services(request)
    if project is not None:
        await blocking(s.store.get_project, validate_name("project", project))
    topics = tuple(validate_name("topic", t) for t in body.topics) if body.topics else None
    key_id, token = new_token()
    key = ApiKey(
        key_id=key_id,
        name=name,
        role=role,
        project=project,
        topics=tuple(sorted(set(topics))) if topics is not None else None,
        digest=token_digest(token),
        created_at_ms=now,
        expires_at_ms=body.expires_at_ms,
    )
    stored = await blocking(s.store.keys.create, key)
    s.auth.learn(key_id)
    return reply(KeyCreatedOut, {**key_view(stored), "key": token}, 201)


@router.post(
    "/v1/keys",
    status_code=201,
    response_model=None,
    summary="Create a key of any project, or an admin key (shown once)",
    responses={201: {"model": KeyCreatedOut}, **errors(400, 404)},
)
@allow(Permission.ADMIN)
async def create_any_key(request: Request, body: AnyKeyCreate) -> Response:
    return await _create(request, body.project, body)


@router.get(
    "/v1/keys",
    response_model=None,
    summary="Every key not revoked (never a secret)",
    responses={200: {"model": KeysOut}},
)
@allow(Permission.ADMIN)
async def list_all_keys(request: Request) -> Response:
    found = await blocking(services(request).store.keys.list)
    return reply(KeysOut, {"keys": [key_view(k) for k in found]})


@router.delete(
    "/v1/keys/{key_id}",
    status_code=204,
    response_model=None,
    summary="Revoke a key",
    responses=errors(404),
)
@allow(Permission.ADMIN)
async def revoke_any_key(request: Request, key_id: str) -> Response:
    s = services(request)
    await blocking(s.store.keys.revoke, key_id)
    s.auth.forget(key_id)
    return Response(status_code=204)


@router.post(
    _PROJECT_KEYS,
    status_code=201,
    response_model=None,
    summary="Create a key of the project (shown once)",
    responses={201: {"model": KeyCreatedOut}, **errors(400, 404)},
)
@allow(Permission.MANAGE)
async def create_key(request: Request, project: str, body: KeyCreate) -> Response:
    return await _create(request, project, body)


@router.get(
    _PROJECT_KEYS,
    response_model=None,
    summary="The project's keys not revoked (never a secret)",
    responses={200: {"model": KeysOut}},
)
@allow(Permission.READ_KEYS)
async def list_keys(request: Request, project: str) -> Response:
    found = await blocking(services(request).store.keys.list, project)
    return reply(KeysOut, {"keys": [key_view(k) for k in found]})


@router.delete(
    _PROJECT_KEYS + "/{key_id}",
    status_code=204,
    response_model=None,
    summary="Revoke a key of the project",
    responses=errors(404),
)
@allow(Permission.MANAGE)
async def revoke_key(request: Request, project: str, key_id: str) -> Response:
    s = services(request)
    await blocking(s.store.keys.revoke, key_id, project)
    s.auth.forget(key_id)
    return Response(status_code=204)
