"""A token endpoint for tests: the OAuth2 client credentials grant (RFC 6749 §4.4) over TLS,
with the client authenticating by HTTP Basic or in the form, and an endpoint that accepts only
the bearer tokens it issued and not yet revoked."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import secrets
import ssl
from collections.abc import AsyncIterator
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
        try:
            while True:
                line, headers, body = await read_request(reader)
                form = {k: v[0] for k, v in parse_qs(body.decode()).items()}
                self.forms.append(form)
                if self.failing:
                    answer(
                        writer, "503 Service Unavailable", b'{"error": "temporarily_unavailable"}'
                    )
                elif not line.startswith("POST ") or form.get("grant_type") != "client_credentials":
                    answer(writer, "400 Bad Request", b'{"error": "unsupported_grant_type"}')
                elif self._client(headers, form) != (self.client_id, self.client_secret):
                    answer(writer, "401 Unauthorized", b'{"error": "invalid_client"}')
                else:
                    token = secrets.token_urlsafe(16)
                    self.issued.append(token)
                    grant: dict[str, object] = {"access_token": token, "token_type": "Bearer"}
                    if self.expires_in is not None:
                        grant["expires_in"] = self.expires_in
                    answer(writer, "200 OK", orjson.dumps(grant))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()

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
        try:
            while True:
                _, headers, _ = await read_request(reader)
                self.seen.append(headers.get("authorization"))
                ok = self.tokens.accepts(headers.get("authorization"))
                answer(writer, "200 OK" if ok else "401 Unauthorized")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()


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
