"""JSON responses and the one error shape of the API: ``{"error": {"code", "message"}}``.

Every failure reaches the caller in that shape: Setu's own errors with their status, request
validation as 400 ``invalid_input``, unknown routes as 404 ``not_found``, anything unexpected
as 500 ``internal`` (logged, details not leaked).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict
from starlette.exceptions import HTTPException
from starlette.responses import Response
from starlette.routing import BaseRoute, Match
from starlette.types import Scope, Send

from setu.errors import SetuError

log = logging.getLogger(__name__)

_HTTP_CODES = {404: "not_found", 405: "method_not_allowed", 413: "payload_too_large"}


class JSON(Response):
    """A JSON response serialised with orjson."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


class Out(BaseModel):
    """A documented response body: exactly these fields, no more (the OpenAPI document says
    ``additionalProperties: false``)."""

    model_config = ConfigDict(extra="forbid")


def reply(model: type[Out], content: dict[str, Any], status_code: int = 200) -> JSON:
    """``content`` as the response, once it was checked against ``model``, the body the route
    documents: a view that drifts from its documentation fails loudly (500, logged) instead of
    answering something the OpenAPI document does not say."""
    model.model_validate(content)
    return JSON(content, status_code=status_code)


def error_body(code: str, message: str) -> dict[str, dict[str, str]]:
    return {"error": {"code": code, "message": message}}


def error_response(status: int, code: str, message: str) -> JSON:
    return JSON(error_body(code, message), status_code=status)


def error_headers(exc: SetuError) -> list[tuple[bytes, bytes]]:
    """The headers besides the body that an error's answer carries, as raw ASGI headers."""
    return [(name.lower().encode(), value.encode()) for name, value in exc.headers()]


async def send_json(
    send: Send, status: int, body: bytes, headers: Iterable[tuple[bytes, bytes]] = ()
) -> None:
    """A JSON answer as plain ASGI messages, for middleware: a Response object costs more
    than the rest of a produce reply."""
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def describe_validation(errors: Any) -> str:
    """One line naming each invalid field, e.g. ``body.partitions: Input should be ...``."""
    parts = []
    for error in list(errors)[:5]:
        where = ".".join(str(p) for p in error.get("loc", ()))
        parts.append(f"{where}: {error.get('msg', 'invalid')}" if where else error.get("msg", ""))
    return "; ".join(parts) or "invalid request"


async def _setu_error(_: Request, exc: Exception) -> Response:
    assert isinstance(exc, SetuError)
    response = error_response(exc.status, exc.code, exc.message)
    response.headers.update(dict(exc.headers()))
    return response


async def _validation_error(_: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    return error_response(400, "invalid_input", describe_validation(exc.errors()))


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = _HTTP_CODES.get(exc.status_code, f"http_{exc.status_code}")
    if exc.status_code == 404 and exc.detail == "Not Found":
        message = f"no route for {request.method} {request.url.path}"
    else:
        message = str(exc.detail)
    response = error_response(exc.status_code, code, message)
    if exc.headers:
        response.headers.update(exc.headers)
    if exc.status_code == 405:
        response.headers["Allow"] = ", ".join(allowed_methods(request.app.router.routes, request))
    return response


def _leaf_routes(routes: Iterable[Any]) -> Iterator[BaseRoute]:
    """The routes themselves, those of routers included in the app among them."""
    for route in routes:
        inner = getattr(route, "original_router", None)
        if inner is not None:  # a router included in the app: its own routes
            yield from _leaf_routes(inner.routes)
        elif isinstance(route, BaseRoute):
            yield route


def allowed_methods(routes: Iterable[Any], request: Request) -> list[str]:
    """Every method some route serves at the request's path (a 405's ``Allow``: Starlette
    names only the first route that matched the path)."""
    methods: set[str] = set()
    for route in _leaf_routes(routes):
        match, _ = route.matches({**request.scope, "method": "GET"})
        if match is not Match.NONE:
            methods.update(getattr(route, "methods", None) or ())
    return sorted(methods)


def route_path(routes: Iterable[Any], scope: Scope) -> str | None:
    """The path template of the first route whose path matches the request's (any method),
    for labelling a request answered before routing."""
    for route in _leaf_routes(routes):
        match, _ = route.matches(scope)
        path = getattr(route, "path", None)
        if match is not Match.NONE and isinstance(path, str):
            return path
    return None


async def _unexpected(request: Request, exc: Exception) -> Response:
    log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return error_response(500, "internal", "internal error")


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(SetuError, _setu_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected)
