"""Before a request's body is read, the API served over real HTTP refuses a caller without a
valid key (401) and a body over its route's limit (413), and closes the connection
(api/gate.py, docs/security.md §9, docs/limits.md)."""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from setu.limits import MAX_CONTROL_BODY_BYTES
from tests.integration.api.support import ADMIN_KEY, answer_until_closed, served_api

pytestmark = pytest.mark.integration

GIGABYTE = 1_000_000_000
JSON = "Content-Type: application/json"
ADMIN = f"Authorization: Bearer {ADMIN_KEY}"
OVER_CONTROL_LIMIT = MAX_CONTROL_BODY_BYTES + 1


@pytest.fixture(scope="module")
def api_url(
    kafka_bootstrap: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    with served_api(
        tmp_path_factory.mktemp("gate"), kafka_bootstrap=kafka_bootstrap, redis_url=redis_url
    ) as url:
        yield url


def port_of(url: str) -> int:
    port = httpx.URL(url).port
    assert port is not None
    return port


def head(method: str, path: str, *headers: str) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: setu", *headers, "", ""]
    return "\r\n".join(lines).encode()


def status_and_headers(answer: bytes) -> tuple[int, dict[str, str]]:
    top = answer.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
    fields = dict(line.split(": ", 1) for line in top[1:])
    return int(top[0].split(" ")[1]), {name.lower(): value for name, value in fields.items()}


def admin_client(url: str) -> httpx.Client:
    return httpx.Client(base_url=url, headers={"Authorization": f"Bearer {ADMIN_KEY}"})


@pytest.mark.finding("H2")
@pytest.mark.parametrize(
    "path",
    [
        "/v1/projects",  # the control plane (FastAPI reads a body before its dependencies)
        "/v1/projects/p/topics/t/produce",  # the produce fast path
        "/v1/projects/p/topics/t/produce/batch",
        "/v1/no-such-route",
    ],
)
@pytest.mark.parametrize("authorization", [None, "Bearer setu_0123456789abcdef_nope", "Basic x"])
def test_a_caller_without_a_valid_key_is_answered_401_before_sending_its_body(
    api_url: str, path: str, authorization: str | None
) -> None:
    with socket.create_connection(("127.0.0.1", port_of(api_url)), timeout=10) as conn:
        # Given the head of a request announcing a body of a gigabyte, and none of the body
        auth = [] if authorization is None else [f"Authorization: {authorization}"]
        conn.sendall(head("POST", path, *auth, JSON, f"Content-Length: {GIGABYTE}"))
        # Then the answer is a 401 in the API's error shape, and the connection is closed
        # (answer_until_closed fails on the socket's timeout if the server waits for the body)
        answer = answer_until_closed(conn)
    status, fields = status_and_headers(answer)
    assert status == 401, answer[:300]
    assert fields["connection"] == "close"
    assert fields["www-authenticate"] == "Bearer"
    assert b'{"error":{"code":"unauthorized","message":"' in answer


@pytest.mark.finding("H2")
def test_a_declared_body_over_a_control_routes_limit_is_413_before_it_is_sent(
    api_url: str,
) -> None:
    # Given an admin's create-project head announcing a body one byte over the limit
    with socket.create_connection(("127.0.0.1", port_of(api_url)), timeout=10) as conn:
        conn.sendall(
            head(
                "POST", "/v1/projects", ADMIN, JSON, f"Content-Length: {MAX_CONTROL_BODY_BYTES + 1}"
            )
        )
        # Then it is answered 413 at once, and the connection closed
        answer = answer_until_closed(conn)
    status, fields = status_and_headers(answer)
    assert status == 413, answer[:300]
    assert fields["connection"] == "close"
    assert b'{"error":{"code":"payload_too_large","message":"' in answer


def test_a_chunked_body_over_a_control_routes_limit_is_cut_off_with_413(api_url: str) -> None:
    with socket.create_connection(("127.0.0.1", port_of(api_url)), timeout=10) as conn:
        # Given an admin's create-project request with a chunked body one byte over the
        # limit, whose end never comes
        conn.sendall(head("POST", "/v1/projects", ADMIN, JSON, "Transfer-Encoding: chunked"))
        chunk = 64 * 1024
        for _ in range(MAX_CONTROL_BODY_BYTES // chunk):
            conn.sendall(b"%x\r\n%s\r\n" % (chunk, b" " * chunk))
        conn.sendall(b"1\r\n \r\n")
        # Then the API answers 413 once the limit is passed, and closes the connection
        answer = answer_until_closed(conn)
    status, fields = status_and_headers(answer)
    assert status == 413, answer[:300]
    assert fields["connection"] == "close"
    assert b'{"error":{"code":"payload_too_large","message":"' in answer


def test_a_body_within_the_limit_is_still_read_and_a_bad_key_is_still_401(
    api_url: str,
) -> None:
    # The sentinel of the tests above: the same API serves a valid request with a body
    with admin_client(api_url) as client:
        name = "gate" + os.urandom(4).hex()
        created = client.post("/v1/projects", json={"name": name, "description": "d" * 900})
        assert created.status_code == 201, created.text
        assert client.delete(f"/v1/projects/{name}").status_code in (200, 204)
        refused = client.get("/v1/projects", headers={"Authorization": "Bearer nope"})
    assert refused.status_code == 401
    assert refused.json()["error"]["code"] == "unauthorized"


def rss_bytes() -> int:
    """This process's resident memory (the API is served in a thread of it)."""
    resident_pages = int(Path("/proc/self/statm").read_text().split()[1])
    return resident_pages * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.finding("H2")
def test_anonymous_callers_sending_large_bodies_cost_the_api_no_memory(api_url: str) -> None:
    port = port_of(api_url)
    body = memoryview(b"{" + b" " * (16 * 1024 * 1024))  # made before the first measure
    before = rss_bytes()
    connections = []
    try:
        # Given 8 anonymous callers that each announce 150 MB and send 16 MB of it, all
        # held open: an API that read what they send would hold 128 MB
        for _ in range(8):
            conn = socket.create_connection(("127.0.0.1", port), timeout=10)
            connections.append(conn)
            conn.sendall(head("POST", "/v1/projects", JSON, "Content-Length: 150000000"))
            # (answered and closed before it was all sent: what should happen)
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                conn.sendall(body)
        # Then this process (client and API) grew by far less than what was sent: the bound
        # leaves room for allocator noise and the other threads of this process
        grown = rss_bytes() - before
        assert grown < 32 * 1024 * 1024, f"RSS grew by {grown / 2**20:.0f} MiB"
        # And every connection was answered 401 (or reset, when the close raced the body
        # still coming) and closed
        for conn in connections:
            try:
                answer = answer_until_closed(conn)
            except ConnectionResetError:
                answer = b""
            assert answer == b"" or answer.startswith(b"HTTP/1.1 401 "), answer[:300]
    finally:
        for conn in connections:
            conn.close()
    # And the API still serves a caller with a key (the sentinel)
    with admin_client(api_url) as client:
        assert client.get("/v1/projects").status_code == 200
