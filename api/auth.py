"""Authentication and the access rule of every route (docs/security.md).

Every ``/v1`` route but ``GET /v1/health`` needs ``Authorization: Bearer <key>``.
:class:`Authenticator` turns the header into a :class:`~setu.access.Principal`: the bootstrap
admin key (``SETU_ADMIN_KEY``) or a stored key, looked up by its public id and compared by
digest. Keys are cached for ``ttl_s`` (2 s) per API process, so a revocation or an expiry
holds on every replica within that time while a busy producer costs one query per key per
TTL; the last-used time is written at most once a minute per key, off the request.

The request gate (:mod:`api.gate`) authenticates every request that needs a key before any
body is read, and leaves the caller in the ASGI scope under :data:`PRINCIPAL_KEY`;
:func:`authenticated` takes it from there (or authenticates, where no gate ran).

Each route declares the permission it needs with :func:`allow`; the router-level dependency
:func:`authorize` checks it against the caller and the route's ``project`` (and ``topic``)
path parameters. A route that declares nothing is refused to every caller (and the access test
in ``tests/integration/api/test_access.py`` fails), so forgetting a rule never opens a route.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.types import Scope

from api.ttl_cache import LoadingCache
from setu.access import (
    ApiKey,
    Permission,
    Principal,
    Role,
    check,
    digest,
    key_id_of,
    same_digest,
)
from setu.clock import now_ms
from setu.errors import Forbidden, Unauthorized
from state.api_keys import KeyStore

log = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])

_RULE_ATTRIBUTE = "__setu_permission__"

ADMIN_KEY_ID = "bootstrap"
# Where the request gate leaves the caller it authenticated, in the ASGI scope.
PRINCIPAL_KEY = "setu.principal"
_TOUCH_EVERY_MS = 60_000


def allow(permission: Permission) -> Callable[[F], F]:
    """Declares what a route needs; put it under the route decorator."""

    def mark(endpoint: F) -> F:
        setattr(endpoint, _RULE_ATTRIBUTE, permission)
        return endpoint

    return mark


def rule_of(endpoint: Callable[..., Any]) -> Permission | None:
    permission = getattr(endpoint, _RULE_ATTRIBUTE, None)
    return permission if isinstance(permission, Permission) else None


@dataclass(frozen=True, slots=True)
class _Known:
    key: ApiKey
    principal: Principal


_BOOTSTRAP = Principal(ADMIN_KEY_ID, "SETU_ADMIN_KEY", Role.ADMIN, None)
_UNCHECKED = Principal(ADMIN_KEY_ID, "auth disabled", Role.ADMIN, None)


class Authenticator:
    """Finds the caller of a request; see the module doc."""

    def __init__(
        self,
        keys: KeyStore,
        admin_key: str | None,
        *,
        enabled: bool = True,
        ttl_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._keys = keys
        self._admin_digest = digest(admin_key) if admin_key else None
        self.enabled = enabled
        self._cache: LoadingCache[str, _Known] = LoadingCache(
            self._load, ttl_s=ttl_s, negative_ttl_s=ttl_s, clock=clock
        )
        # Every key id there is, asked for at most once per ttl_s: a well-formed id that is
        # not among them is refused without a query of its own, so a flood of random ids
        # costs the database one query per ttl_s, not one per id.
        self._ttl_s = ttl_s
        self._clock = clock
        self._ids: frozenset[str] = frozenset()
        self._ids_at = -math.inf
        self._ids_loading: asyncio.Task[None] | None = None
        self._touched: dict[str, int] = {}
        self._touching: set[asyncio.Task[None]] = set()

    async def principal(self, authorization: str | None) -> Principal:
        """The caller a request's ``Authorization`` header names; Unauthorized otherwise."""
        if not self.enabled:
            return _UNCHECKED
        token = _bearer(authorization)
        token_digest = digest(token)
        if self._admin_digest is not None and same_digest(token_digest, self._admin_digest):
            return _BOOTSTRAP
        key_id = key_id_of(token)
        if key_id is None or not await self._may_exist(key_id):
            raise Unauthorized("unknown API key")
        known = await self._cache.get(key_id)
        if known is None or not same_digest(known.key.digest, token_digest):
            raise Unauthorized("unknown API key")
        now = now_ms()
        if known.key.revoked_at_ms is not None:
            raise Unauthorized("this API key was revoked")
        if not known.key.usable(now):
            raise Unauthorized("this API key has expired")
        self._touch(key_id, now)
        return known.principal

    def learn(self, key_id: str) -> None:
        """A key was just made here: it is usable on this replica at once (on the others
        within ttl_s)."""
        self._ids = self._ids | {key_id}

    async def _may_exist(self, key_id: str) -> bool:
        """Whether ``key_id`` is among the key ids, as known at most ttl_s ago."""
        if key_id in self._ids:
            return True
        if self._clock() - self._ids_at < self._ttl_s:
            return False
        if self._ids_loading is None:
            self._ids_loading = asyncio.create_task(self._load_ids())
        loading = self._ids_loading
        await asyncio.shield(loading)
        return key_id in self._ids

    async def _load_ids(self) -> None:
        try:
            started = self._clock()
            self._ids = await asyncio.to_thread(self._keys.ids)
            self._ids_at = started
        finally:
            self._ids_loading = None

    def forget(self, key_id: str) -> None:
        """Drops a key from this process's cache (it was just revoked here)."""
        self._cache.invalidate(key_id)

    async def _load(self, key_id: str) -> _Known | None:
        key = await asyncio.to_thread(self._keys.find, key_id)
        return _Known(key, key.principal()) if key is not None else None

    def _touch(self, key_id: str, now: int) -> None:
        if now - self._touched.get(key_id, 0) < _TOUCH_EVERY_MS:
            return
        if len(self._touched) > 100_000:
            self._touched.clear()
        self._touched[key_id] = now
        task = asyncio.create_task(asyncio.to_thread(self._keys.touch, key_id, now))
        self._touching.add(task)
        task.add_done_callback(self._touched_done)

    def _touched_done(self, task: asyncio.Task[None]) -> None:
        self._touching.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("could not record a key's last use: %s", task.exception())


def _bearer(authorization: str | None) -> str:
    if not authorization:
        raise Unauthorized("an API key is needed: Authorization: Bearer <key>")
    scheme, _, token = authorization.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise Unauthorized("an API key is needed: Authorization: Bearer <key>")
    return token


def header_value(headers: Iterable[tuple[bytes, bytes]]) -> str | None:
    """The ``Authorization`` value among raw ASGI headers (the produce fast path)."""
    for name, value in headers:
        if name == b"authorization":
            return value.decode("latin-1")
    return None


async def authenticated(authenticator: Authenticator, scope: Scope) -> Principal:
    """The caller of a request: the one the request gate found, else the one its
    ``Authorization`` header names (Unauthorized when none)."""
    found = scope.get(PRINCIPAL_KEY)
    if isinstance(found, Principal):
        return found
    return await authenticator.principal(header_value(scope["headers"]))


# Declares the scheme in OpenAPI (so /docs can authorize); the check itself is ours.
_bearer_scheme = HTTPBearer(auto_error=False, description="An API key (docs/security.md)")


async def authorize(
    request: Request,
    _: HTTPAuthorizationCredentials | None = Depends(_bearer_scheme),  # noqa: B008
) -> Principal:
    """The router-level dependency: the caller, once it may do what the route needs."""
    authenticator: Authenticator = request.app.state.authenticator
    who = await authenticated(authenticator, request.scope)
    route = request.scope.get("route")
    need = rule_of(route.endpoint) if route is not None else None
    if need is None:
        log.error("route %s declares no access rule; refused", request.url.path)
        raise Forbidden("this route declares no access rule")
    params = request.path_params
    check(who, need, params.get("project"), params.get("topic"))
    request.state.principal = who
    return who


def caller(request: Request) -> Principal:
    """The principal :func:`authorize` found for this request."""
    who: Principal = request.state.principal
    return who
