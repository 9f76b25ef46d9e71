"""The API's HTTP server refuses an oversized request head with 431 (api/server.py)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest
import uvicorn

from api.server import uvicorn_options
from setu.limits import MAX_REQUEST_HEAD_BYTES
from tests.waiting import wait_for

pytestmark = pytest.mark.integration


async def app(scope: dict, receive: object, send: object) -> None:  # type: ignore[type-arg]
    assert scope["type"] == "http"
    await send({"type": "http.response.start", "status": 200, "headers": []})  # type: ignore[operator]
    await send({"type": "http.response.body", "body": b"ok"})  # type: ignore[operator]


@pytest.fixture
def server() -> Iterator[int]:
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", **uvicorn_options())
    running = uvicorn.Server(config)
    thread = threading.Thread(target=running.run, daemon=True)
    thread.start()
    wait_for("server started", lambda: running.started)
    yield running.servers[0].sockets[0].getsockname()[1]
    running.should_exit = True
    thread.join(10)


def exchange(port: int, head: bytes, chunk: int = 64 * 1024) -> bytes:
    """Sends ``head`` in chunks, stopping early if the server closes; returns everything it
    answered until it closed the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        try:
            for start in range(0, len(head), chunk):
                conn.sendall(head[start : start + chunk])
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered and closed before the head was sent in full
        answer = b""
        try:
            while data := conn.recv(65536):
                answer += data
        except ConnectionResetError:
            pass
        return answer


def test_a_head_over_the_limit_is_431_and_one_within_it_is_served(server: int) -> None:
    # Given a request whose headers add up to 64 MiB
    huge = b"GET / HTTP/1.1\r\nHost: x\r\n" + b"X-Pad: " + b"a" * (64 * 1024 * 1024) + b"\r\n\r\n"
    # Then it is answered 431 in the API's error shape, long before it was all sent
    answer = exchange(server, huge)
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]
    assert b'"code":"request_header_fields_too_large"' in answer
    # And a head just within the limit is served, as is a pipelined second request after it
    pads = b"".join(b"X-Pad-%d: %s\r\n" % (n, b"b" * 1000) for n in range(60))
    within = b"GET / HTTP/1.1\r\nHost: x\r\n" + pads + b"\r\n"
    assert len(within) < MAX_REQUEST_HEAD_BYTES
    answer = exchange(server, within + b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert answer.count(b"HTTP/1.1 200 OK") == 2, answer[:300]
