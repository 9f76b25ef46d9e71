"""Small HTTP/1.1 servers for tests on asyncio streams: a request loop (:func:`serve_each`),
a token endpoint for the OAuth2 client credentials grant (RFC 6749 §4.4), with the client
authenticating by HTTP Basic or in the form, and an endpoint that accepts only the bearer
tokens it issued and not yet revoked."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import secrets
import ssl
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from urllib.parse import parse_qs, unquote

import orjson


async def read_request(reader: asyncio.StreamReader) -> tuple[str, dict[str, str], bytes]:
    """One HTTP/1.1 request: its request line, headers (lower-case names) and body."""
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
    line, *rest = head.split("\r\n")
    headers = {
        name.strip().lower(): value.strip()
        for name, _, value in (h.partition(":") for h in rest if h)
    }
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return line, headers, body


def answer(writer: asyncio.StreamWriter, status: str, body: bytes = b"") -> None:
    writer.write(
        f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n\r\n".encode()
        + body
    )


# What a test server answers to one request (line, headers, body): its status and body.
Handle = Callable[[str, dict[str, str], bytes], tuple[str, bytes]]


async def serve_each(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, handle: Handle
) -> None:
    """Answers each request of one connection with ``handle`` until the client goes."""
    try:
        while True:
            status, body = handle(*await read_request(reader))
            answer(writer, status, body)
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
        pass
    finally:
        writer.close()


@dataclass
class TokenServer:
    """Issues tokens to ``client_id``/``client_secret``, each living ``expires_in`` seconds
    (not enforced: tests revoke tokens instead); notes each grant's form."""

    client_id: str = "setu"
    client_secret: str = "s3cret:with/odd=chars"
    expires_in: int | None = 3600
    issued: list[str] = field(default_factory=list)
    revoked: set[str] = field(default_factory=set)
    forms: list[dict[str, str]] = field(default_factory=list)
    failing: bool = False  # answers 503 to grants
    port: int = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await serve_each(reader, writer, self.grant)

    def grant(self, line: str, headers: dict[str, str], body: bytes) -> tuple[str, bytes]:
        form = {k: v[0] for k, v in parse_qs(body.decode()).items()}
        self.forms.append(form)
        if self.failing:
            return "503 Service Unavailable", b'{"error": "temporarily_unavailable"}'
        if not line.startswith("POST ") or form.get("grant_type") != "client_credentials":
            return "400 Bad Request", b'{"error": "unsupported_grant_type"}'
        if self._client(headers, form) != (self.client_id, self.client_secret):
            return "401 Unauthorized", b'{"error": "invalid_client"}'
        token = secrets.token_urlsafe(16)
        self.issued.append(token)
        grant: dict[str, object] = {"access_token": token, "token_type": "Bearer"}
        if self.expires_in is not None:
            grant["expires_in"] = self.expires_in
        return "200 OK", orjson.dumps(grant)

    @staticmethod
    def _client(headers: dict[str, str], form: dict[str, str]) -> tuple[str, str] | None:
        basic = headers.get("authorization", "")
        if basic.startswith("Basic "):
            user, _, password = base64.b64decode(basic[6:]).decode().partition(":")
            return unquote(user), unquote(password)
        if "client_id" in form:
            return form["client_id"], form.get("client_secret", "")
        return None

    def accepts(self, authorization: str | None) -> bool:
        token = (authorization or "").removeprefix("Bearer ")
        return token in self.issued and token not in self.revoked


@dataclass
class ProtectedEndpoint:
    """Answers 200 to calls bearing a token ``tokens`` accepts, 401 to the others."""

    tokens: TokenServer
    port: int = 0
    seen: list[str | None] = field(default_factory=list)

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await serve_each(reader, writer, self.call)

    def call(self, line: str, headers: dict[str, str], body: bytes) -> tuple[str, bytes]:
        self.seen.append(headers.get("authorization"))
        ok = self.tokens.accepts(headers.get("authorization"))
        return ("200 OK" if ok else "401 Unauthorized"), b""


@contextlib.asynccontextmanager
async def serving(
    handler: TokenServer | ProtectedEndpoint, tls: ssl.SSLContext | None
) -> AsyncIterator[int]:
    """``handler`` on 127.0.0.1 (a free port, TLS if given) until the block ends; yields the
    port."""
    server = await asyncio.start_server(handler.serve, "127.0.0.1", 0, ssl=tls)
    handler.port = server.sockets[0].getsockname()[1]
    try:
        yield handler.port
    finally:
        server.close()
