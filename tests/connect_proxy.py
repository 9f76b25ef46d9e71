"""An HTTP proxy for tests that serves ``CONNECT`` only, as an egress proxy does: it opens a
TCP tunnel to the authority asked for and copies bytes both ways. It notes every authority it
was asked for, can require a ``Proxy-Authorization``, and refuses ports it was not told to
allow (403), as tinyproxy's ``ConnectPort`` does."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field


@dataclass
class ConnectProxy:
    authorization: str | None = None  # the Proxy-Authorization value required, if any
    allowed_ports: set[int] | None = None  # None: any
    asked: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    port: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            writer.close()
            return
        request_line, *header_lines = head.split("\r\n")
        method, authority, _ = [*request_line.split(" "), "", ""][:3]
        headers = {
            name.strip().lower(): value.strip()
            for name, _, value in (line.partition(":") for line in header_lines if line)
        }
        self.asked.append(authority)
        host, _, port_text = authority.rpartition(":")
        host = host.strip("[]")
        if method != "CONNECT" or not port_text.isdigit():
            await self._answer(writer, "405 Method Not Allowed", authority)
            return
        if self.authorization is not None and headers.get("proxy-authorization") != (
            self.authorization
        ):
            await self._answer(writer, "407 Proxy Authentication Required", authority)
            return
        if self.allowed_ports is not None and int(port_text) not in self.allowed_ports:
            await self._answer(writer, "403 Forbidden", authority)
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(host, int(port_text))
        except OSError:
            await self._answer(writer, "502 Bad Gateway", authority)
            return
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        await asyncio.gather(_copy(reader, up_writer), _copy(up_reader, writer))

    async def _answer(self, writer: asyncio.StreamWriter, status: str, authority: str) -> None:
        self.refused.append(authority)
        writer.write(f"HTTP/1.1 {status}\r\ncontent-length: 0\r\n\r\n".encode())
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        writer.close()


async def _copy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()


@contextlib.asynccontextmanager
async def running_proxy(proxy: ConnectProxy) -> AsyncIterator[ConnectProxy]:
    """``proxy`` listening on 127.0.0.1 (a free port) until the block ends."""
    server = await asyncio.start_server(proxy.handle, "127.0.0.1", 0)
    proxy.port = server.sockets[0].getsockname()[1]
    try:
        yield proxy
    finally:
        server.close()
