"""The webhook HTTP client against a real server on 127.0.0.1 (asyncio streams)."""

from __future__ import annotations

import asyncio
import re
import socket
import struct
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
import uvloop

from delivery.http import (
    EXCERPT_BYTES,
    HttpClient,
    HttpError,
    RefusedAddress,
    Target,
    UnsafeRequest,
    encode_request,
)
from setu.addresses import Resolver

Handler = Callable[[bytes, asyncio.StreamWriter], Awaitable[bool]]


class Server:
    """Answers each request with what ``handler`` writes; counts connections and requests."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.requests: list[bytes] = []
        self.port = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                request = head + await reader.readexactly(length)
                self.requests.append(request)
                if not await self.handler(request, writer):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


async def ok(_: bytes, writer: asyncio.StreamWriter) -> bool:
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
    return True


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Handler], Awaitable[Server]]]:
    servers: list[asyncio.Server] = []

    async def start(handler: Handler) -> Server:
        server = Server(handler)
        srv = await asyncio.start_server(server.serve, "127.0.0.1", 0)
        server.port = srv.sockets[0].getsockname()[1]
        servers.append(srv)
        return server

    yield start
    for srv in servers:
        srv.close()


def target(server: Server, path: str = "/hook") -> Target:
    return Target.parse(f"http://127.0.0.1:{server.port}{path}")


async def test_sequential_calls_reuse_one_connection(
    serve: Callable[..., Awaitable[Server]],
) -> None:
    server = await serve(ok)
    client = HttpClient(allow_private=True)
    for _ in range(5):
        response = await client.request("POST", target(server), [], b"x", 2.0)
        assert response.status == 200
        await asyncio.sleep(0)  # let the body finish so the connection returns to the pool
    assert server.connections == 1
    client.close()


async def test_a_chunked_body_is_read_to_the_end_and_the_connection_reused(
    serve: Callable[..., Awaitable[Server]],
) -> None:
    async def chunked(_: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(
            b"HTTP/1.1 202 Accepted\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
        )
        return True

    server = await serve(chunked)
    client = HttpClient(allow_private=True)
    for _ in range(3):
        assert (await client.request("POST", target(server), [], b"", 2.0)).status == 202
        await asyncio.sleep(0.01)
    assert server.connections == 1
    client.close()


async def test_connection_close_answers_get_a_new_connection_each(
    serve: Callable[..., Awaitable[Server]],
) -> None:
    async def closing(_: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 0\r\n\r\n")
        return False

    server = await serve(closing)
    client = HttpClient(allow_private=True)
    for _ in range(3):
        assert (await client.request("POST", target(server), [], b"", 2.0)).status == 200
        await asyncio.sleep(0.01)
    assert server.connections == 3
    client.close()


async def test_a_pooled_connection_closed_by_the_server_is_replaced_transparently(
    serve: Callable[..., Awaitable[Server]],
) -> None:
    # Given a server that closes each connection right after its first answer, but says
    # keep-alive (as a server with a short idle timeout does)
    async def once(_: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
        await writer.drain()
        return False

    server = await serve(once)
    client = HttpClient(allow_private=True)
    assert (await client.request("POST", target(server), [], b"a", 2.0)).status == 200
    await asyncio.sleep(0.05)
    # When the next call takes that dead connection from the pool
    response = await client.request("POST", target(server), [], b"b", 2.0)
    # Then it goes out again on a new connection, and the server saw it once
    assert response.status == 200
    assert [r.endswith(b"b") for r in server.requests] == [False, True]
    client.close()


def resetting_server() -> socket.socket:
    """A server that resets each connection as soon as it accepts it (one overwhelmed, or
    behind a proxy that turns callers away), on a thread of its own."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(100)

    def serve() -> None:
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return  # closed: the test ended
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    return sock


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_connection_reset_before_the_request_is_written_fails_the_call_as_a_webhook_error(
    loop: str,
) -> None:
    # A regression: under uvloop (the worker's loop), a connection the server closed before
    # the call wrote its request raised RuntimeError instead of failing the call, and 257
    # runners of a loaded 1,000-subscription worker stopped at once.
    async def scenario() -> list[str]:
        async def loaded() -> None:  # a busy worker: its loop turns take milliseconds
            while not done.is_set():
                time.sleep(0.003)  # noqa: ASYNC251 (blocking on purpose)
                await asyncio.sleep(0)

        done = asyncio.Event()
        busy = asyncio.ensure_future(loaded())
        client = HttpClient(allow_private=True)
        hook = Target.parse(f"http://127.0.0.1:{sock.getsockname()[1]}/hook")
        outcomes = []
        try:
            for _ in range(20):
                try:
                    await client.request("POST", hook, [], b"a", 1.0)
                    outcomes.append("answered")
                except HttpError:
                    outcomes.append("webhook error")  # retried, as any failed call
        finally:
            done.set()
            await busy
            client.close()
        return outcomes

    sock = resetting_server()
    try:
        outcomes = (uvloop.run if loop == "uvloop" else asyncio.run)(scenario())
    finally:
        sock.close()
    assert outcomes == ["webhook error"] * 20


async def test_a_slow_answer_times_out(serve: Callable[..., Awaitable[Server]]) -> None:
    async def slow(_: bytes, writer: asyncio.StreamWriter) -> bool:
        await asyncio.sleep(1.0)
        return await ok(_, writer)

    server = await serve(slow)
    client = HttpClient(allow_private=True)
    with pytest.raises(HttpError, match="timeout"):
        await client.request("POST", target(server), [], b"", 0.1)
    client.close()


async def test_nobody_listening_is_a_refused_connection() -> None:
    client = HttpClient(allow_private=True)
    with pytest.raises(HttpError, match="refused"):
        await client.request("POST", Target.parse("http://127.0.0.1:9/x"), [], b"", 1.0)


async def test_redirects_are_returned_not_followed(serve: Callable[..., Awaitable[Server]]) -> None:
    async def redirect(_: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 302 Found\r\nlocation: /else\r\ncontent-length: 0\r\n\r\n")
        return True

    server = await serve(redirect)
    client = HttpClient(allow_private=True)
    response = await client.request("POST", target(server), [], b"", 1.0)
    assert (response.status, response.headers["location"]) == (302, "/else")
    assert len(server.requests) == 1
    client.close()


async def test_retry_after_and_other_headers_are_readable(
    serve: Callable[..., Awaitable[Server]],
) -> None:
    async def busy(_: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 429 Too Many\r\nRetry-After: 7\r\ncontent-length: 0\r\n\r\n")
        return True

    server = await serve(busy)
    client = HttpClient(allow_private=True)
    response = await client.request("POST", target(server), [], b"", 1.0)
    assert (response.status, response.headers["retry-after"]) == (429, "7")
    client.close()


@pytest.mark.parametrize(
    ("url", "first_lines"),
    [
        ("http://h.test/a/b?x=1&y=2", [b"PUT /a/b?x=1&y=2 HTTP/1.1", b"host: h.test"]),
        ("http://h.test:8080", [b"PUT / HTTP/1.1", b"host: h.test:8080"]),
        ("https://h.test:443/x", [b"PUT /x HTTP/1.1", b"host: h.test"]),
        ("http://[::1]:81/x", [b"PUT /x HTTP/1.1", b"host: [::1]:81"]),
    ],
)
def test_request_line_and_host(url: str, first_lines: list[bytes]) -> None:
    raw = encode_request("PUT", Target.parse(url), [("a", "1")], b"body")
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[:2] == first_lines
    assert b"content-length: 4" in lines and b"a: 1" in lines
    assert body == b"body"


@pytest.mark.parametrize("url", ["ftp://h.test/x", "http:///nohost", "not a url"])
def test_only_http_urls_are_accepted(url: str) -> None:
    with pytest.raises(ValueError, match="not an http"):
        Target.parse(url)


@pytest.mark.parametrize(
    "headers", [[("x_message_id", "m\r\nAuthorization: x")], [("x-a\n", "v")], [("x-a", "\x00")]]
)
def test_the_encoder_refuses_control_characters_whatever_it_is_given(
    headers: list[tuple[str, str]],
) -> None:
    target = Target.parse("http://example.com/hook")
    with pytest.raises(UnsafeRequest) as refused:
        encode_request("POST", target, headers, b"")
    # The reason names the header, never its value (it may be a secret)
    name, value = headers[0]
    assert name.strip() in refused.value.reason
    assert value.strip() not in refused.value.reason


async def test_an_unsafe_request_is_dead_lettered_not_retried() -> None:
    from delivery.webhook import WebhookSender
    from setu.envelope import Envelope
    from setu.outcome import Verdict
    from tests.unit.delivery.sim import subscription

    # Given a message whose id holds a CR LF (it got past validation somehow)
    sender = WebhookSender(subscription(), HttpClient(allow_private=True))
    envelope = Envelope("m1\r\nAuthorization: x", b"{}", group_id="g")
    # When it is sent, nothing goes out and the outcome is final
    outcome = await sender.send(envelope, 1)
    assert outcome.verdict is Verdict.DEAD_LETTER
    assert "control character" in (outcome.error or "")


def resolving(answers: dict[str, list[str]], asked: list[str] | None = None) -> Resolver:
    """A resolver that answers from ``answers`` (and notes each question in ``asked``)."""

    async def resolve(host: str, port: int) -> list[str]:
        if asked is not None:
            asked.append(host)
        return answers[host]

    return resolve


@pytest.mark.parametrize(
    "answer",
    [
        ["127.0.0.1"],
        ["169.254.169.254"],  # cloud metadata
        ["100.100.100.200"],  # shared address space: another cloud's metadata
        ["10.0.0.7"],
        ["::1"],
        ["::ffff:127.0.0.1"],
        ["2002:7f00:1::1"],  # 6to4 of 127.0.0.1
        ["fe80::1"],
        ["8.8.8.8", "127.0.0.1"],  # one inward address among public ones is enough
    ],
)
async def test_a_host_that_resolves_inward_at_call_time_is_refused_before_connecting(
    serve: Callable[..., Awaitable[Server]], answer: list[str]
) -> None:
    # Given a name that passed registration and now resolves inward (DNS rebinding)
    server = await serve(ok)
    client = HttpClient(resolver=resolving({"hooks.example.com": answer}))
    url = Target.parse(f"http://hooks.example.com:{server.port}/hook")
    # When a call is made, then it is refused, naming the address, and nothing connects
    with pytest.raises(RefusedAddress, match=answer[-1].replace(".", r"\.")):
        await client.request("POST", url, [], b"x", 2.0)
    assert server.connections == 0
    client.close()


@pytest.mark.parametrize("host", ["localhost", "2130706433", "0x7f.1"])
async def test_names_and_numeric_forms_of_loopback_are_refused_with_the_system_resolver(
    serve: Callable[..., Awaitable[Server]], host: str
) -> None:
    # "localhost" comes from the machine's hosts file; the others are decimal and short hex
    # spellings of 127.0.0.1 that the system resolver turns into the address itself
    server = await serve(ok)
    client = HttpClient()
    with pytest.raises(RefusedAddress, match=re.escape("127.0.0.1")):
        await client.request("POST", Target.parse(f"http://{host}:{server.port}/"), [], b"", 2.0)
    assert server.connections == 0
    client.close()


async def test_the_client_connects_to_the_address_it_checked_without_a_second_lookup(
    serve: Callable[..., Awaitable[Server]],
) -> None:
    # Given a name only the injected resolver knows (the system's would fail on it)
    server = await serve(ok)
    asked: list[str] = []
    client = HttpClient(
        allow_private=True, resolver=resolving({"hook.invalid": ["127.0.0.1"]}, asked)
    )
    url = Target.parse(f"http://hook.invalid:{server.port}/hook")
    # When it is called, then the call reaches the address the resolver gave, asked once
    assert (await client.request("POST", url, [], b"x", 2.0)).status == 200
    assert asked == ["hook.invalid"]
    assert server.connections == 1
    client.close()


async def test_a_refused_address_is_dead_lettered_with_its_reason() -> None:
    from delivery.webhook import WebhookSender
    from setu.envelope import Envelope
    from setu.outcome import Verdict
    from tests.unit.delivery.sim import subscription

    sub = subscription()
    host = Target.parse(sub.endpoint.url).origin.host
    sender = WebhookSender(sub, HttpClient(resolver=resolving({host: ["169.254.169.254"]})))
    outcome = await sender.send(Envelope("m1", b"{}", group_id="g"), 1)
    assert outcome.verdict is Verdict.DEAD_LETTER and outcome.refused
    assert "169.254.169.254" in (outcome.error or "")


async def test_a_failed_answer_keeps_the_start_of_its_body_and_a_2xx_none(
    serve: Callable[..., Awaitable[Server]],
) -> None:
    bodies = {
        b"/big": b"HTTP/1.1 500 Oops\r\ncontent-length: 10000\r\n\r\n" + b"e" * 10_000,
        b"/short": b'HTTP/1.1 422 No\r\ncontent-length: 22\r\n\r\n{"error": "bad field"}',
        b"/fine": b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nthank",
        b"/stuck": b"HTTP/1.1 503 Busy\r\ncontent-length: 100\r\n\r\npart",
    }

    async def answer(request: bytes, writer: asyncio.StreamWriter) -> bool:
        path = request.split(b" ")[1]
        writer.write(bodies[path])
        return path != b"/stuck"  # that one never sends the rest, and never closes

    server = await serve(answer)
    client = HttpClient(allow_private=True)
    big = await client.request("POST", target(server, "/big"), [], b"", 2.0)
    assert (big.status, big.excerpt) == (500, b"e" * EXCERPT_BYTES)
    short = await client.request("POST", target(server, "/short"), [], b"", 2.0)
    assert short.excerpt == b'{"error": "bad field"}'
    assert (await client.request("POST", target(server, "/fine"), [], b"", 2.0)).excerpt == b""
    # A failed answer whose body stalls is still that answer at the deadline, with what came
    stuck = await client.request("POST", target(server, "/stuck"), [], b"", 0.3)
    assert (stuck.status, stuck.excerpt) == (503, b"part")
    client.close()
