"""A small HTTP/1.1 client for webhook calls: keep-alive connections per origin, no redirects.

Why not httpx: on the 2-core machine Setu is measured on, httpx spent about 230 µs of CPU per
request in its own layers, and its connection pool scans every connection on every request;
the whole per-message budget of the delivery target (4,700 messages/s) is about 210 µs. This
client writes the request in one ``write`` and parses the answer with ``httptools`` (the parser
uvicorn uses), about 40 µs per call.

Contract:

- :meth:`HttpClient.request` returns the status and headers as soon as the head of a 2xx
  response has arrived; the body is read and discarded in the background, and the connection
  goes back to the pool only when the response is complete and the server allows keep-alive.
  Any other status waits for the first :data:`EXCERPT_BYTES` of the body too (or its end, or
  the deadline), kept as ``Response.excerpt`` for the message's attempt log: what the receiver
  said about its failure.
- A timeout covers connecting, sending and waiting for the head; on timeout the connection is
  closed. Deadlines are checked by one sweep every 50 ms rather than a timer per call (the
  timers cost more than the rest of the call's Python), so a timeout fires up to 50 ms late.
  Errors are raised as :class:`HttpError` with a short reason ("timeout", "connection
  refused", ...).
- A request on a pooled connection that the server closed while idle is sent once more on a
  new connection (nothing of it was answered, so the server never acted on it).
- Redirects are returned as they are, never followed.
- Every new connection starts with a lookup of the host by the client itself; unless private
  endpoints are allowed, any address of the answer that :mod:`setu.addresses` refuses stops
  the call before it connects (:class:`RefusedAddress`, never retried), and otherwise the
  client connects to the very addresses it checked, with no second lookup (docs/security.md
  §4). TLS still verifies the certificate against the host name.
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
import ssl
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast
from urllib.parse import SplitResult, urlsplit

import httptools

from delivery.egress import DIRECT, Route, TunnelError, open_tunnel
from setu.addresses import Resolver, is_private_address, system_resolver
from setu.egress import tls_context
from setu.model import EndpointTls

# Idle connections kept per origin beyond this are closed.
DEFAULT_MAX_IDLE = 512
SWEEP_S = 0.05


class HttpError(Exception):
    """Raised when a call gets no HTTP answer: timeout, refused, reset, bad response."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class RefusedAddress(HttpError):
    """The host resolved to an address a webhook may not reach: nothing was sent."""


class _Stale(Exception):
    """A pooled connection was closed before any of the answer arrived."""


@dataclass(frozen=True, slots=True)
class Origin:
    scheme: str
    host: str
    port: int

    @classmethod
    def of(cls, url: SplitResult) -> Origin:
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"not an http(s) URL: {url.geturl()!r}")
        port = url.port or (443 if url.scheme == "https" else 80)
        return cls(url.scheme, url.hostname, port)

    @property
    def host_header(self) -> str:
        default = 443 if self.scheme == "https" else 80
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == default else f"{host}:{self.port}"


@dataclass(frozen=True, slots=True)
class Target:
    """A parsed URL, ready to send to: its origin and the request-target."""

    origin: Origin
    path: str

    @classmethod
    def parse(cls, url: str) -> Target:
        parts = urlsplit(url)
        path = parts.path or "/"
        if parts.query:
            path = f"{path}?{parts.query}"
        return cls(Origin.of(parts), path)


# How much of a failed call's answer is kept (the message's attempt log, docs/design.md §9).
EXCERPT_BYTES = 4096
# How much of an answer a call that reads the body keeps (a token endpoint's, say).
BODY_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    headers: dict[str, str]  # lower-case names; the last value wins
    # The start of the body of an answer that is not 2xx (empty for a 2xx), or of any answer
    # when the call asked for its body (``read_body``: up to BODY_BYTES).
    excerpt: bytes = b""


class _Connection(asyncio.Protocol):
    """One keep-alive connection; at most one request at a time."""

    def __init__(self, pool: _Pool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.head: asyncio.Future[Response] | None = None
        self.status = 0
        self.headers: dict[str, str] = {}
        self.header_name = b""
        self.answered = False  # any byte of the current answer arrived
        self.complete = False
        self.closed = False
        self.used = False
        self.deadline = 0.0
        # The body's start, collected while a non-2xx answer's head waits for it.
        self.excerpt: bytearray | None = None
        self.read_body = False  # the current request wants any answer's body

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not subclasses of asyncio.Transport, but behave as one.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.answered = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self.fail(HttpError(f"bad response: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.pool.forget(self)
        if self.excerpt is not None:
            self._answer_with_excerpt()  # a non-2xx head arrived: its body ended here
        if self.head is not None and not self.head.done():
            if not self.answered and self.used:
                self.head.set_exception(_Stale())
            else:
                self.head.set_exception(HttpError("connection closed"))

    # httptools callbacks

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        if 200 <= self.status < 300 and not self.read_body:
            if self.head is not None and not self.head.done():
                self.head.set_result(Response(self.status, self.headers))
        else:
            self.excerpt = bytearray()

    def on_body(self, body: bytes) -> None:
        excerpt = self.excerpt
        if excerpt is not None and self.head is not None and not self.head.done():
            keep = BODY_BYTES if self.read_body else EXCERPT_BYTES
            excerpt += body[: keep - len(excerpt)]
            if len(excerpt) >= keep:
                self._answer_with_excerpt()

    def _answer_with_excerpt(self) -> None:
        if self.head is not None and not self.head.done():
            self.head.set_result(Response(self.status, self.headers, bytes(self.excerpt or b"")))

    def on_message_complete(self) -> None:
        self._answer_with_excerpt()
        self.complete = True
        keep = self.parser.should_keep_alive()
        self.head = None
        if keep and not self.closed:
            self.pool.release(self)
        else:
            self.close()

    # use

    def send(self, request: bytes, read_body: bool = False) -> asyncio.Future[Response]:
        assert self.transport is not None
        if self.transport.is_closing():
            # Pooled, and closed since (the server's FIN read, its connection_lost not yet
            # run): nothing is sent, and the caller tries a new connection. uvloop raises on
            # a write to a closed transport, where asyncio drops it.
            raise _Stale()
        self.head = asyncio.get_running_loop().create_future()
        self.headers = {}
        self.excerpt = None
        self.read_body = read_body
        self.answered = False
        self.complete = False
        self.transport.write(request)
        return self.head

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def fail(self, error: Exception) -> None:
        if self.excerpt is not None:
            # The head is here and only its body is late: the answer stands, with what came.
            self._answer_with_excerpt()
        if self.head is not None and not self.head.done():
            self.head.set_exception(error)
        self.close()


class _Pool:
    """The idle connections to one origin over one route."""

    def __init__(
        self, origin: Origin, route: Route, tls: ssl.SSLContext | None, max_idle: int
    ) -> None:
        self.origin = origin
        self.route = route
        self.tls = tls
        self.max_idle = max_idle
        self.idle: list[_Connection] = []

    async def connect(self, addresses: list[str], proxy_addresses: list[str]) -> _Connection:
        """A connection to the first of ``addresses`` that accepts one (all checked), through
        the route's proxy (found at ``proxy_addresses``) if it has one."""
        loop = asyncio.get_running_loop()
        o = self.origin
        last: OSError | None = None
        for address in addresses:
            try:
                if self.route.proxy is not None:
                    conn = _Connection(self)
                    await open_tunnel(
                        self.route.proxy, proxy_addresses, address, o.port, conn, self.tls, o.host
                    )
                    return conn
                _, made = await loop.create_connection(
                    lambda: _Connection(self),
                    address,
                    o.port,
                    ssl=self.tls,
                    server_hostname=o.host if self.tls else None,
                )
                return made
            except ssl.SSLError:
                raise
            except OSError as exc:
                last = exc
        raise last or OSError(f"{o.host} has no address")

    def take(self) -> _Connection | None:
        while self.idle:
            conn = self.idle.pop()
            if not conn.closed:
                return conn
        return None

    def release(self, conn: _Connection) -> None:
        if len(self.idle) < self.max_idle:
            self.idle.append(conn)
        else:
            conn.close()

    def forget(self, conn: _Connection) -> None:
        if conn in self.idle:
            self.idle.remove(conn)

    def close(self) -> None:
        for conn in self.idle:
            conn.close()
        self.idle.clear()


class UnsafeRequest(HttpError):
    """A request line or header holds a control character: it is never sent."""


def encode_request(
    method: str, target: Target, headers: Sequence[tuple[str, str]], body: bytes
) -> bytes:
    """The bytes of one request. Everything was checked when it entered Setu; a CR, LF or
    other control character found here anyway is refused (:class:`UnsafeRequest`), never
    written: it would split the request or start a header of someone else's choosing."""
    for where, part in (("method", method), ("path", target.path)):
        if _UNSAFE.search(part):
            raise UnsafeRequest(f"control character in the request {where}: {part[:40]!r}")
    for name, value in headers:
        if _UNSAFE.search(name) or _UNSAFE.search(value):
            # Named, never shown: a header value may be a secret (docs/security.md §5).
            raise UnsafeRequest(f"control character in the request header {name[:40]!r}")
    lines = [
        f"{method} {target.path} HTTP/1.1",
        f"host: {target.origin.host_header}",
        f"content-length: {len(body)}",
    ]
    lines.extend(f"{name}: {value}" for name, value in headers)
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


_UNSAFE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


def _refused(address: str) -> bool:
    try:
        return is_private_address(ipaddress.ip_address(address.split("%", 1)[0]))
    except ValueError:
        return True  # not an address at all: never connect to it


class HttpClient:
    """Webhook calls over pooled keep-alive connections (see the module doc)."""

    def __init__(
        self,
        *,
        allow_private: bool = False,
        resolver: Resolver = system_resolver,
        max_idle_per_origin: int = DEFAULT_MAX_IDLE,
    ) -> None:
        self._allow_private = allow_private
        self._resolve = resolver
        self._pools: dict[tuple[Origin, Route], _Pool] = {}
        self._max_idle = max_idle_per_origin
        # One verifying context per distinct TLS setting (None: the system's CAs only).
        self._contexts: dict[EndpointTls | None, ssl.SSLContext] = {}
        # How many senders hold each route (:meth:`hold`).
        self._holders: Counter[Route] = Counter()
        self._waiting: set[_Connection] = set()  # connections waiting for an answer's head
        self._sweeper: asyncio.Task[None] | None = None

    def _pool(self, origin: Origin, route: Route) -> _Pool:
        pool = self._pools.get((origin, route))
        if pool is None:
            tls = None
            if origin.scheme == "https":
                tls = self._contexts.get(route.tls)
                if tls is None:
                    try:
                        tls = self._contexts[route.tls] = tls_context(route.tls)
                    except (ssl.SSLError, ValueError) as exc:
                        # Checked when stored; a call fails rather than the runner if not.
                        raise HttpError(f"TLS settings do not load: {exc}") from None
            pool = self._pools[origin, route] = _Pool(origin, route, tls, self._max_idle)
        return pool

    def hold(self, route: Route) -> None:
        """A sender calls over ``route`` from now on (subscriptions with the same TLS and
        proxy settings share one route, and its pools)."""
        self._holders[route] += 1

    def release(self, route: Route) -> None:
        """A sender no longer calls over ``route`` (its subscription's TLS or proxy setting
        changed). Once no sender holds it, its idle connections and TLS context go; calls in
        flight finish as they are."""
        self._holders[route] -= 1
        if self._holders[route] > 0:
            return
        del self._holders[route]
        for key in [key for key in self._pools if key[1] == route]:
            self._pools.pop(key).close()
        if route.tls is not None and not any(r.tls == route.tls for _, r in self._pools):
            self._contexts.pop(route.tls, None)

    async def request(
        self,
        method: str,
        target: Target,
        headers: Sequence[tuple[str, str]],
        body: bytes,
        timeout_s: float,
        route: Route = DIRECT,
        *,
        read_body: bool = False,
    ) -> Response:
        """One call over ``route``; ``read_body``: the answer's body is wanted whatever its
        status (``Response.excerpt``, up to :data:`BODY_BYTES`)."""
        if self._sweeper is None:
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep())
        pool = self._pool(target.origin, route)
        payload = encode_request(method, target, headers, body)
        deadline = asyncio.get_running_loop().time() + timeout_s
        conn = pool.take()
        if conn is not None:
            try:
                return await self._send(conn, payload, deadline, read_body)
            except _Stale:
                pass  # closed while idle: the server saw nothing of this request
        conn = await self._connect(pool, deadline)
        try:
            return await self._send(conn, payload, deadline, read_body)
        except _Stale:
            raise HttpError("connection closed") from None

    async def _connect(self, pool: _Pool, deadline: float) -> _Connection:
        left = deadline - asyncio.get_running_loop().time()
        try:
            return await asyncio.wait_for(self._open(pool), max(left, 0.001))
        except TimeoutError:
            raise HttpError("timeout") from None
        except TunnelError as exc:
            raise HttpError(str(exc)) from None
        except ConnectionRefusedError:
            raise HttpError("connection refused") from None
        except ssl.SSLError as exc:
            raise HttpError(f"TLS: {exc.reason or exc}") from None
        except socket.gaierror as exc:
            raise HttpError(f"resolve {pool.origin.host}: {exc.strerror or exc}") from None
        except OSError as exc:
            raise HttpError(f"connect: {exc.strerror or exc}") from None

    async def _open(self, pool: _Pool) -> _Connection:
        """Looks the host up, refuses what the address rule forbids, connects to the rest."""
        host = pool.origin.host
        addresses = await self._resolve(host, pool.origin.port)
        if not self._allow_private:
            for address in addresses:
                if _refused(address):
                    raise RefusedAddress(
                        f"refused: {host} resolves to {address}, a private, loopback or "
                        "link-local address (SETU_ALLOW_PRIVATE_ENDPOINTS=true allows it)"
                    )
        proxy = pool.route.proxy
        # The proxy is the operator's choice (docs/security.md §4): not held to the rule.
        proxy_addresses = [] if proxy is None else await self._resolve(proxy.host, proxy.port)
        return await pool.connect(addresses, proxy_addresses)

    async def _send(
        self, conn: _Connection, payload: bytes, deadline: float, read_body: bool
    ) -> Response:
        conn.deadline = deadline
        self._waiting.add(conn)
        try:
            response = await conn.send(payload, read_body)
        except BaseException:
            conn.close()
            raise
        finally:
            self._waiting.discard(conn)
        conn.used = True
        return response

    async def _sweep(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(SWEEP_S)
            now = loop.time()
            for conn in [c for c in self._waiting if c.deadline <= now]:
                conn.fail(HttpError("timeout"))

    def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()
