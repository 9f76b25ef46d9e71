"""How a webhook call leaves Setu: the TLS identity it shows and the proxy it goes through
(docs/security.md §4, "Protected endpoints").

- :class:`setu.model.EndpointTls`: a client certificate and key for mutual TLS, and a CA to
  trust beside the system's, as PEM text; the client makes one context per distinct setting
  (:func:`setu.egress.tls_context`).
- :class:`Proxy`: an HTTP proxy every connection is tunnelled through with ``CONNECT``. The
  tunnel is asked for the *address* Setu resolved and checked (the SSRF rule), never for the
  host name: the proxy does no lookup of its own, so a name that resolves inward at the proxy
  cannot get past the check. TLS runs end to end inside the tunnel and verifies the
  certificate against the endpoint's host name. Plain ``http`` endpoints are tunnelled the same
  way, so the proxy must allow ``CONNECT`` to their ports.
"""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass
from typing import cast

from setu.egress import Proxy
from setu.model import EndpointTls

# The longest CONNECT answer head read before giving up on the proxy.
MAX_TUNNEL_HEAD = 16 * 1024


class TunnelError(OSError):
    """The proxy did not open the tunnel: its status line, or why it could not be read."""


@dataclass(frozen=True, slots=True)
class Route:
    """What a call's connection is made with, besides its origin: a pool serves one route."""

    tls: EndpointTls | None = None
    proxy: Proxy | None = None


DIRECT = Route()


class _TunnelOpening(asyncio.Protocol):
    """Reads the proxy's answer to ``CONNECT``; the connection is handed on after it."""

    def __init__(self) -> None:
        self.head = bytearray()
        self.opened: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def data_received(self, data: bytes) -> None:
        if self.opened.done():
            return
        self.head += data
        end = self.head.find(b"\r\n\r\n")
        if end < 0:
            if len(self.head) > MAX_TUNNEL_HEAD:
                self.opened.set_exception(TunnelError("proxy: answer head too long"))
            return
        status_line = bytes(self.head[: self.head.find(b"\r\n")]).decode("latin-1")
        parts = status_line.split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or parts[1] != "200":
            self.opened.set_exception(TunnelError(f"proxy answered {status_line[:80]!r}"))
        elif end + 4 != len(self.head):
            # The endpoint speaks only after the request: bytes now are the proxy's own.
            self.opened.set_exception(TunnelError("proxy: data after its answer"))
        else:
            self.opened.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.opened.done():
            self.opened.set_exception(TunnelError("proxy closed the connection"))


async def open_tunnel(
    proxy: Proxy,
    proxy_addresses: list[str],
    address: str,
    port: int,
    protocol: asyncio.Protocol,
    tls: ssl.SSLContext | None,
    server_hostname: str,
) -> asyncio.Transport:
    """A connection to ``address``:``port`` through ``proxy`` (at the first of
    ``proxy_addresses`` that accepts), with TLS inside the tunnel when ``tls`` is given, handed
    to ``protocol`` (its ``connection_made`` is called)."""
    loop = asyncio.get_running_loop()
    last: OSError | None = None
    transport: asyncio.BaseTransport | None = None
    opening = _TunnelOpening()
    for proxy_address in proxy_addresses:
        try:
            transport, _ = await loop.create_connection(lambda: opening, proxy_address, proxy.port)
            break
        except OSError as exc:
            last = exc
    if transport is None:
        raise TunnelError(f"proxy {proxy.host}: {getattr(last, 'strerror', None) or last}")
    stream = cast(asyncio.Transport, transport)
    try:
        authority = f"[{address}]:{port}" if ":" in address else f"{address}:{port}"
        lines = [f"CONNECT {authority} HTTP/1.1", f"host: {authority}"]
        if proxy.authorization:
            lines.append(f"proxy-authorization: {proxy.authorization}")
        stream.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        await opening.opened
        if tls is not None:
            upgraded = await loop.start_tls(stream, opening, tls, server_hostname=server_hostname)
            if upgraded is None:
                raise TunnelError("proxy: the tunnel closed during the TLS handshake")
            stream = upgraded
    except BaseException:
        stream.close()
        raise
    stream.set_protocol(protocol)
    protocol.connection_made(stream)
    return stream
