"""The API's HTTP server refuses an oversized request head with 431, however it arrives, and
closes a connection whose head does not arrive in time (api/server.py)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import pytest
import uvicorn

from api.server import uvicorn_options
from setu.limits import MAX_REQUEST_HEAD_BYTES
from tests.integration.api.support import answer_until_closed, exchange
from tests.waiting import wait_for

pytestmark = pytest.mark.integration

# Short enough for the tests to wait out, long enough for any head sent in one piece here.
HEAD_TIMEOUT_MS = 500
# The event loop may run a timer up to its clock's resolution early.
EARLIEST_CLOSE_S = HEAD_TIMEOUT_MS / 1000 - 0.01


async def app(scope: dict, receive: object, send: object) -> None:  # type: ignore[type-arg]
    assert scope["type"] == "http"
    await send({"type": "http.response.start", "status": 200, "headers": []})  # type: ignore[operator]
    await send({"type": "http.response.body", "body": b"ok"})  # type: ignore[operator]


@contextmanager
def serving(**options: int) -> Iterator[int]:
    """``app`` served by uvicorn with the API's options, in a thread; yields its port."""
    config = uvicorn.Config(
        app, host="127.0.0.1", port=0, log_level="warning", **uvicorn_options(**options)
    )
    running = uvicorn.Server(config)
    thread = threading.Thread(target=running.run, daemon=True)
    thread.start()
    wait_for("server started", lambda: running.started)
    try:
        yield running.servers[0].sockets[0].getsockname()[1]
    finally:
        running.should_exit = True
        thread.join(10)


@pytest.fixture
def server() -> Iterator[int]:
    with serving() as port:
        yield port


@pytest.fixture
def impatient_server() -> Iterator[int]:
    with serving(head_timeout_ms=HEAD_TIMEOUT_MS) as port:
        yield port


def head_of(size: int) -> bytes:
    """A GET whose line and headers take exactly ``size`` bytes, in headers of about 1 KB."""
    start, end = b"GET / HTTP/1.1\r\nHost: x\r\n", b"\r\n"
    pads: list[bytes] = []
    room = size - len(start) - len(end)
    while room > 0:
        name = b"X-Pad-%d: " % len(pads)
        # 1 KB headers, and the last one takes what is left (between 1 and 2 KB)
        value = room - len(name) - 2 if room < 2200 else 1000
        pads.append(name + b"b" * value + b"\r\n")
        room -= len(pads[-1])
    return start + b"".join(pads) + end


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


@pytest.mark.finding("I1")
@pytest.mark.parametrize("size", [66_000, 100_000, 200_000])
def test_a_head_over_the_limit_sent_in_one_piece_is_431(server: int, size: int) -> None:
    # Given a whole head over the limit, sent at once (it arrives in one read, or a few)
    head = head_of(size)
    assert len(head) == size > MAX_REQUEST_HEAD_BYTES
    # Then it is answered 431, and the request never reaches the application
    answer = exchange(server, head, chunk=len(head))
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]
    assert b'"code":"request_header_fields_too_large"' in answer
    assert b"200 OK" not in answer
    # And the same head a little under the limit is served: the count is the head's own
    fits = head_of(MAX_REQUEST_HEAD_BYTES - 2048)
    answer = exchange(server, fits + b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert answer.count(b"HTTP/1.1 200 OK") == 2, answer[:300]


@pytest.mark.finding("L4")
def test_partial_heads_are_closed_after_the_head_timeout(impatient_server: int) -> None:
    port = impatient_server
    with ExitStack() as stack:
        # Given 200 connections that each send part of a head and then nothing, and one that
        # sends nothing at all
        partial = []
        opened = time.monotonic()
        for n in range(200):
            conn = stack.enter_context(socket.create_connection(("127.0.0.1", port), timeout=10))
            conn.sendall(b"POST /v1/projects HTTP/1.1\r\nHost: x\r\nX-Slow-%d: " % n)
            partial.append(conn)
        silent = stack.enter_context(socket.create_connection(("127.0.0.1", port), timeout=10))
        # Then each is answered 408 in the API's error shape and closed
        for conn in partial:
            answer = answer_until_closed(conn)
            assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
            assert b'"code":"request_timeout"' in answer
        # And the silent one is closed without an answer
        assert answer_until_closed(silent) == b""
        # Not before the timeout, and soon after it (5 s of slack for a loaded machine)
        elapsed = time.monotonic() - opened
        assert EARLIEST_CLOSE_S <= elapsed < EARLIEST_CLOSE_S + 5
        # And the server still serves a request whose head comes in time
        assert exchange(port, b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").startswith(
            b"HTTP/1.1 200 OK"
        )


def test_a_slow_head_within_the_timeout_and_an_idle_keep_alive_are_not_cut(
    impatient_server: int,
) -> None:
    port = impatient_server
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        # Given a head sent in two parts, the second well within the head timeout
        conn.sendall(b"GET / HTTP/1.1\r\n")
        conn.sendall(b"Host: x\r\n\r\n")
        # Then it is served
        assert read_response(conn).startswith(b"HTTP/1.1 200 OK")
        # And the connection, idle between requests for twice the head timeout, stays open:
        # that is uvicorn's keep-alive timeout's to end (5 s), not the head timeout's
        conn.settimeout(2 * HEAD_TIMEOUT_MS / 1000)
        with pytest.raises(TimeoutError):
            conn.recv(1)
        conn.settimeout(10)
        # (the sentinel: the same connection serves the next request)
        conn.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert answer_until_closed(conn).startswith(b"HTTP/1.1 200 OK")


def read_response(conn: socket.socket) -> bytes:
    """One response of ``app`` (its body is ``ok``, chunked) read from a kept-alive
    connection."""
    answer = b""
    while not answer.endswith(b"ok\r\n0\r\n\r\n"):
        data = conn.recv(65536)
        assert data, f"closed after {answer!r}"
        answer += data
    return answer


def test_blank_lines_between_requests_do_not_hold_a_connection(impatient_server: int) -> None:
    with socket.create_connection(("127.0.0.1", impatient_server), timeout=10) as conn:
        # Given a served request, then only an empty line (which begins no request but
        # stops uvicorn's keep-alive timer)
        conn.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_response(conn).startswith(b"HTTP/1.1 200 OK")
        opened = time.monotonic()
        conn.sendall(b"\r\n")
        # Then the connection is closed after the head timeout, without an answer
        assert answer_until_closed(conn) == b""
        assert EARLIEST_CLOSE_S <= time.monotonic() - opened < EARLIEST_CLOSE_S + 5
