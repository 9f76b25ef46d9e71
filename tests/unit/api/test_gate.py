"""The request gate's rules, and the gate itself driven with plain ASGI messages (api/gate.py)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import cast

import orjson
import pytest
from fastapi import FastAPI
from fastapi.routing import APIRoute
from starlette.types import Message, Receive, Scope, Send

from api.app import ROUTERS, create_app, document_real_errors
from api.auth import PRINCIPAL_KEY, Authenticator, authorize, header_value
from api.gate import BodyLimits, RequestGate, needs_key, read_head
from api.responses import route_path
from setu.access import Principal, Role
from setu.limits import MAX_CONTROL_BODY_BYTES
from setu.settings import Settings
from state.api_keys import KeyStore

ADMIN_KEY = "gate-test-admin-key-0123456789"
LIMITS = BodyLimits(message=1000, batch=5000)


@pytest.mark.parametrize(
    ("path", "needed"),
    [
        ("/v1/projects", True),
        ("/v1/projects/p/topics/t/produce", True),
        ("/v1/keys", True),
        ("/v1/no-such-route", True),
        ("/v1", True),
        ("/v1/health", False),
        ("/metrics", False),
        ("/docs", False),
        ("/openapi.json", False),
        ("/v1health", False),
    ],
)
def test_every_v1_path_but_health_needs_a_key(path: str, needed: bool) -> None:
    assert needs_key(path) is needed


def test_every_route_that_authorizes_is_one_the_gate_authenticates() -> None:
    # Otherwise FastAPI would read such a route's body before its dependency refused the
    # caller: the gate's path rule must cover every route with the access rule
    for module in ROUTERS:
        for route in module.router.routes:
            assert isinstance(route, APIRoute)
            guarded = any(d.call is authorize for d in route.dependant.dependencies)
            assert needs_key(route.path) is guarded, route.path


def test_every_operation_with_a_body_documents_the_gates_413() -> None:
    # The gate refuses a body over its route's limit on any route (a replay request with a
    # few million message ids got 413 where its operation did not say so)
    app = FastAPI()
    for module in ROUTERS:
        app.include_router(module.router)
    document_real_errors(app)
    document = app.openapi()
    schemas = document["components"]["schemas"]
    with_body = 0
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            if "requestBody" not in operation:
                continue
            with_body += 1
            found = operation["responses"].get("413")
            assert found is not None, f"{method.upper()} {path}"
            ref = found["content"]["application/json"]["schema"]["$ref"]
            assert ref.rsplit("/", 1)[-1] in schemas
    assert with_body > 10


@pytest.mark.parametrize(
    ("path", "limit"),
    [
        ("/v1/projects/p/topics/t/produce", 1000),
        ("/v1/projects/p/topics/t/produce/batch", 5000),
        ("/v1/projects", MAX_CONTROL_BODY_BYTES),
        ("/v1/projects/p/subscriptions/s/dlq/unsideline", MAX_CONTROL_BODY_BYTES),
        ("/v1/projects/p/topics/t/produce/other", MAX_CONTROL_BODY_BYTES),
        ("/v1/health", MAX_CONTROL_BODY_BYTES),
    ],
)
def test_each_route_has_its_body_limit(path: str, limit: int) -> None:
    assert LIMITS.of(path) == limit


@pytest.mark.parametrize(
    ("headers", "head"),
    [
        ([(b"content-length", b"12")], (None, 12, False)),
        ([(b"host", b"x"), (b"content-length", b"0")], (None, 0, False)),
        ([(b"transfer-encoding", b"chunked")], (None, None, True)),
        (
            [(b"authorization", b"Bearer a"), (b"authorization", b"Bearer b")],
            ("Bearer a", None, False),
        ),
        ([], (None, None, False)),
    ],
)
def test_what_the_gate_needs_is_read_from_the_head_in_one_pass(
    headers: list[tuple[bytes, bytes]], head: tuple[str | None, int | None, bool]
) -> None:
    assert read_head(headers) == head


def test_the_gate_reads_the_key_as_the_routes_do() -> None:
    # The routes' fallback (api.auth.header_value) and the gate must name the same key
    headers = [(b"authorization", b"Bearer \xe9a"), (b"authorization", b"Bearer b")]
    assert read_head(headers).authorization == header_value(headers)


class _NoKeys:
    """A key store that knows no key (only the bootstrap admin key is valid)."""

    def find(self, key_id: str) -> None:
        return None

    def ids(self) -> frozenset[str]:
        return frozenset()


class Exchange:
    """One request through the gate: what the application saw and what was sent back."""

    def __init__(self, body: list[bytes] | None = None) -> None:
        self.body = list(body or [])
        self.received = 0
        self.sent: list[Message] = []
        self.app_called = False

    async def receive(self) -> Message:
        chunk = self.body.pop(0)
        self.received += 1
        return {"type": "http.request", "body": chunk, "more_body": bool(self.body)}

    async def send(self, message: Message) -> None:
        self.sent.append(message)

    @property
    def status(self) -> int:
        return int(self.sent[0]["status"])

    @property
    def headers(self) -> dict[bytes, bytes]:
        return dict(self.sent[0]["headers"])

    @property
    def error(self) -> dict[str, str]:
        error: dict[str, str] = orjson.loads(self.sent[1]["body"])["error"]
        return error


def scope_of(path: str, headers: list[tuple[bytes, bytes]]) -> Scope:
    auth = Authenticator(cast(KeyStore, _NoKeys()), ADMIN_KEY)
    app = SimpleNamespace(
        state=SimpleNamespace(services=SimpleNamespace(auth=auth)),
        router=SimpleNamespace(routes=[]),
    )
    return {"type": "http", "method": "POST", "path": path, "headers": headers, "app": app}


async def through_gate(
    scope: Scope, exchange: Exchange, read_body: bool = True, answer: int = 200
) -> Scope:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        exchange.app_called = True
        more = read_body
        while more:
            message = await receive()
            more = message.get("more_body", False)
        await send({"type": "http.response.start", "status": answer, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    await RequestGate(app, LIMITS)(scope, exchange.receive, exchange.send)
    return scope


ADMIN = (b"authorization", b"Bearer " + ADMIN_KEY.encode())


@pytest.mark.parametrize("authorization", [None, b"Bearer unknown", b"Basic abc"])
async def test_a_caller_without_a_valid_key_is_refused_before_its_body_is_read(
    authorization: bytes | None,
) -> None:
    # Given a request announcing a gigabyte, without a valid key
    headers = [(b"content-length", b"1000000000")]
    if authorization is not None:
        headers.append((b"authorization", authorization))
    exchange = Exchange([b"never read"])
    await through_gate(scope_of("/v1/projects", headers), exchange)
    # Then it is answered 401 in the error shape, closing the connection, unread and unrouted
    assert exchange.status == 401
    assert exchange.headers[b"connection"] == b"close"
    assert exchange.headers[b"www-authenticate"] == b"Bearer"
    assert exchange.error["code"] == "unauthorized"
    assert exchange.received == 0
    assert not exchange.app_called


async def test_the_caller_found_is_left_for_the_routes() -> None:
    exchange = Exchange([b"{}"])
    scope = await through_gate(
        scope_of("/v1/projects", [ADMIN, (b"content-length", b"2")]), exchange
    )
    assert exchange.status == 200
    who = scope[PRINCIPAL_KEY]
    assert isinstance(who, Principal)
    assert who.role is Role.ADMIN


async def test_a_public_path_needs_no_key() -> None:
    exchange = Exchange()
    scope = await through_gate(scope_of("/v1/health", []), exchange, read_body=False)
    assert exchange.status == 200
    assert PRINCIPAL_KEY not in scope


@pytest.mark.parametrize(
    ("path", "length", "status"),
    [
        ("/v1/projects", MAX_CONTROL_BODY_BYTES + 1, 413),
        ("/v1/projects", MAX_CONTROL_BODY_BYTES, 200),
        ("/v1/projects/p/topics/t/produce", 1001, 413),
        ("/v1/projects/p/topics/t/produce", 1000, 200),
        ("/v1/projects/p/topics/t/produce/batch", 5001, 413),
    ],
)
async def test_a_declared_body_over_the_routes_limit_is_413_before_it_is_read(
    path: str, length: int, status: int
) -> None:
    exchange = Exchange([b"x" * length])
    await through_gate(scope_of(path, [ADMIN, (b"content-length", b"%d" % length)]), exchange)
    assert exchange.status == status
    if status == 413:
        assert exchange.error["code"] == "payload_too_large"
        assert exchange.headers[b"connection"] == b"close"
        assert exchange.received == 0


async def test_a_chunked_body_is_cut_off_at_the_routes_limit() -> None:
    # Given a produce body without a declared length, sent in chunks past the limit of 1000
    exchange = Exchange([b"x" * 600, b"x" * 600, b"x" * 600])
    chunked = [ADMIN, (b"transfer-encoding", b"chunked")]
    await through_gate(scope_of("/v1/projects/p/topics/t/produce", chunked), exchange)
    # Then reading stops at the chunk that passes it, with 413, closing the connection
    assert exchange.received == 2
    assert exchange.status == 413
    assert exchange.error["code"] == "payload_too_large"
    assert exchange.headers[b"connection"] == b"close"


async def test_a_chunked_body_within_the_limit_keeps_the_connection() -> None:
    exchange = Exchange([b"x" * 400, b"x" * 600])
    chunked = [ADMIN, (b"transfer-encoding", b"chunked")]
    await through_gate(scope_of("/v1/projects/p/topics/t/produce", chunked), exchange)
    assert exchange.status == 200
    assert b"connection" not in exchange.headers


async def test_an_answer_before_a_chunked_body_ended_closes_the_connection() -> None:
    # Given a route that answers without reading the chunked body sent to it
    exchange = Exchange([b"x" * 10, b"x" * 10])
    chunked = [ADMIN, (b"transfer-encoding", b"chunked")]
    await through_gate(scope_of("/v1/projects", chunked), exchange, read_body=False, answer=404)
    # Then the answer closes the connection, so the server does not go on reading the body
    assert exchange.status == 404
    assert exchange.headers[b"connection"] == b"close"


@pytest.mark.parametrize(
    ("method", "path", "template"),
    [
        ("POST", "/v1/projects", "/v1/projects"),
        (
            "POST",
            "/v1/projects/p/topics/t/produce",
            "/v1/projects/{project}/topics/{topic}/produce",
        ),
        ("PATCH", "/v1/projects/p", "/v1/projects/{project}"),  # a method the route lacks
        ("GET", "/v1/no-such-route", None),
    ],
)
def test_a_refusal_is_labelled_with_the_route_it_was_meant_for(
    method: str, path: str, template: str | None
) -> None:
    routes = create_app(Settings()).router.routes
    scope = {"type": "http", "method": method, "path": path, "root_path": "", "headers": []}
    assert route_path(routes, scope) == template
