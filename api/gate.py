"""What the API decides from a request's head alone, before it reads a byte of its body.

:class:`RequestGate` runs before anything that could read a body: only the security headers
and metrics middleware, which touch no body, come before it (api/app.py). Then:

- A request that needs a key (:func:`needs_key`) is authenticated first, by the same
  :class:`~api.auth.Authenticator` the routes use. Without a valid key it is answered 401 at
  once, with ``Connection: close``: the body it announced is never read, however large.
  The caller found is left in the scope (``api.auth.PRINCIPAL_KEY``) for the routes and the
  produce fast path, which check its permission.
- Every route has a body limit (:class:`BodyLimits`, docs/limits.md). A ``Content-Length``
  over it is answered 413 at once, also closing the connection; a body sent without one
  (chunked) is counted as the route reads it and cut off with 413 at the limit.

Answers take the API's error shape. A chunked body that the route answered before reading
to its end closes the connection too, so the server does not go on reading it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

import orjson
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.auth import PRINCIPAL_KEY
from api.metrics import ROUTE_KEY
from api.produce import PRODUCE_RE
from api.responses import error_body, error_headers, route_path, send_json
from setu.errors import PayloadTooLarge, SetuError
from setu.limits import MAX_CONTROL_BODY_BYTES

# /v1 paths anyone may call (docs/design.md §8); other paths (/metrics, /docs, /console,
# /openapi.json, /static) are not /v1 and need no key either.
PUBLIC_PATHS = frozenset({"/v1/health"})

_CLOSE = (b"connection", b"close")


def needs_key(path: str) -> bool:
    """Whether a request to ``path`` must carry a valid key: every ``/v1`` path but
    :data:`PUBLIC_PATHS`, whether a route serves it or not (an unknown path is 401 too)."""
    return (path == "/v1" or path.startswith("/v1/")) and path not in PUBLIC_PATHS


@dataclass(frozen=True, slots=True)
class BodyLimits:
    """The largest request body of each route, in bytes (docs/limits.md)."""

    message: int  # single produce: SETU_MAX_MESSAGE_BYTES
    batch: int  # batch produce: SETU_MAX_BATCH_BYTES
    control: int = MAX_CONTROL_BODY_BYTES  # every other route

    def of(self, path: str) -> int:
        """The limit of the route at ``path``."""
        produce = PRODUCE_RE.match(path)
        if produce is None:
            return self.control
        return self.batch if produce.group(3) else self.message


def over_limit(limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(f"the request body is over this route's limit of {limit} bytes")


class RequestHead(NamedTuple):
    """What the gate reads from a request's headers, in one pass (the produce path pays it)."""

    authorization: str | None
    # None without Content-Length (the server refuses a malformed or repeated one before
    # the application sees the request)
    length: int | None
    # Transfer-Encoding: without Content-Length, the only way an HTTP/1.1 body comes
    chunked: bool


def read_head(headers: Iterable[tuple[bytes, bytes]]) -> RequestHead:
    authorization = length = None
    chunked = False
    for name, value in headers:
        if name == b"authorization" and authorization is None:
            authorization = value.decode("latin-1")
        elif name == b"content-length":
            length = int(value) if value.isdigit() else None
        elif name == b"transfer-encoding":
            chunked = True
    return RequestHead(authorization, length, chunked)


class BodyOverLimit(HTTPException):
    """Raised from ``receive`` when a body without ``Content-Length`` goes over its route's
    limit. An HTTPException, so that FastAPI passes it on while it reads a body (it turns
    any other error there into a 400); the error handlers answer it 413 ``payload_too_large``."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, over_limit(limit).message)


class _CountedBody:
    """``receive`` and ``send`` of one request whose body has no declared length."""

    __slots__ = ("_receive", "_send", "ended", "limit", "size", "started")

    def __init__(self, receive: Receive, send: Send, limit: int) -> None:
        self._receive = receive
        self._send = send
        self.limit = limit
        self.size = 0
        self.ended = False
        self.started = False

    async def receive(self) -> Message:
        message = await self._receive()
        if message["type"] == "http.request":
            self.size += len(message.get("body", b""))
            self.ended = not message.get("more_body", False)
            if self.size > self.limit:
                raise BodyOverLimit(self.limit)
        return message

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.started = True
            if not self.ended:
                # Answered before the body ended: do not go on reading it.
                message = {**message, "headers": [*message.get("headers", ()), _CLOSE]}
        await self._send(message)


class RequestGate:
    """ASGI middleware: authentication and body limits before any body is read (module doc)."""

    def __init__(self, app: ASGIApp, limits: BodyLimits) -> None:
        self.app = app
        self.limits = limits

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        head = read_head(scope["headers"])
        limit = self.limits.of(path)
        try:
            if needs_key(path):
                auth = scope["app"].state.services.auth
                scope[PRINCIPAL_KEY] = await auth.principal(head.authorization)
            if head.length is not None and head.length > limit:
                raise over_limit(limit)
        except SetuError as exc:
            await refuse(scope, send, exc)
            return
        if head.length is not None or not head.chunked:
            await self.app(scope, receive, send)
            return
        body = _CountedBody(receive, send, limit)
        try:
            await self.app(scope, body.receive, body.send)
        except BodyOverLimit:
            # Raised through a middleware (the produce fast path) rather than answered.
            if body.started:
                raise
            await refuse(scope, send, over_limit(limit))


async def refuse(scope: Scope, send: Send, exc: SetuError) -> None:
    """Answers ``exc`` in the API's error shape and closes the connection, whose request
    body was not read in full; labelled in metrics with the route it was meant for."""
    template = route_path(scope["app"].router.routes, scope)
    if template is not None and ROUTE_KEY not in scope:
        scope[ROUTE_KEY] = template
    body = orjson.dumps(error_body(exc.code, exc.message))
    await send_json(send, exc.status, body, [*error_headers(exc), _CLOSE])
