"""OAuth2 client credentials for webhook calls (docs/security.md §4, "Protected endpoints").

A subscription with ``oauth2`` settings sends ``Authorization: Bearer <token>`` with every
call. The token comes from the settings' token endpoint (RFC 6749 §4.4, the client
credentials grant; the client authenticates with HTTP Basic, or in the form with
``client_auth: post``), is cached per worker, and is fetched again before it expires: at
:data:`REFRESH_AT` of its lifetime, and at most :data:`REFRESH_BEFORE_S` before its end. Calls
made while a fetch runs wait for that one fetch. An answer of 401 to a call drops the token it
carried, and the call is made once more with a new one (delivery/webhook.py); a second 401 is
the call's answer.

The token endpoint is called with Setu's own webhook client: the address rule (a token URL
that resolves inward is refused at call time) and the subscription's proxy and CA apply to it
as to the endpoint. A general OAuth2 library would bring an HTTP stack of its own that does
its own lookups, past that rule.
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import quote, urlencode

import orjson

from delivery.egress import DIRECT, Route
from delivery.http import HttpClient, HttpError, RefusedAddress, Target
from setu.model import OAuth2Credentials

# A token is fetched again once this share of its lifetime has passed ...
REFRESH_AT = 0.8
# ... and at the latest this long before it expires.
REFRESH_BEFORE_S = 60.0
# The lifetime assumed when the token endpoint gives none.
DEFAULT_LIFETIME_S = 300.0
TOKEN_TIMEOUT_S = 10.0


class TokenError(HttpError):
    """No token: the token endpoint failed or answered something that is not a token. The
    reason never holds the client secret."""


@dataclass(frozen=True, slots=True)
class Token:
    value: str = field(repr=False)
    refresh_at: float  # monotonic seconds


def token_request(credentials: OAuth2Credentials) -> tuple[list[tuple[str, str]], bytes]:
    """The headers and form body of a client credentials request."""
    form = {"grant_type": "client_credentials"}
    if credentials.scopes:
        form["scope"] = " ".join(credentials.scopes)
    if credentials.audience:
        form["audience"] = credentials.audience
    headers = [
        ("content-type", "application/x-www-form-urlencoded"),
        ("accept", "application/json"),
    ]
    if credentials.client_auth == "post":
        form["client_id"] = credentials.client_id
        form["client_secret"] = credentials.client_secret
    else:
        # RFC 6749 §2.3.1: each part form-encoded before the Basic encoding
        pair = (
            f"{quote(credentials.client_id, safe='')}:{quote(credentials.client_secret, safe='')}"
        )
        headers.append(("authorization", "Basic " + base64.b64encode(pair.encode()).decode()))
    return headers, urlencode(form).encode()


def parse_token(status: int, body: bytes, now: float) -> Token:
    """The token of a token endpoint's answer, or :class:`TokenError` saying what was wrong."""
    try:
        answer = orjson.loads(body) if body else {}
    except orjson.JSONDecodeError:
        answer = None
    if not isinstance(answer, dict):
        raise TokenError(f"oauth2: token endpoint answered {status} without a JSON object")
    if not 200 <= status < 300:
        error = answer.get("error")
        named = f": {str(error)[:80]}" if isinstance(error, str) else ""
        raise TokenError(f"oauth2: token endpoint answered {status}{named}")
    value = answer.get("access_token")
    if not isinstance(value, str) or not value:
        raise TokenError("oauth2: token endpoint answered without an access_token")
    token_type = answer.get("token_type", "bearer")
    if not isinstance(token_type, str) or token_type.lower() != "bearer":
        raise TokenError(f"oauth2: token type {str(token_type)[:40]!r} is not bearer")
    lifetime = answer.get("expires_in", DEFAULT_LIFETIME_S)
    if isinstance(lifetime, str) and lifetime.isdigit():
        lifetime = int(lifetime)  # some servers send it as a string
    if not isinstance(lifetime, int | float) or isinstance(lifetime, bool) or lifetime <= 0:
        lifetime = DEFAULT_LIFETIME_S
    refresh_in = max(0.0, min(lifetime * REFRESH_AT, lifetime - REFRESH_BEFORE_S))
    return Token(value, now + refresh_in)


class TokenSource:
    """One subscription's token, fetched when needed and shared by its calls."""

    def __init__(
        self,
        credentials: OAuth2Credentials,
        client: HttpClient,
        route: Route = DIRECT,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.credentials = credentials
        self.route = route
        self._client = client
        self._clock = clock
        self._target = Target.parse(credentials.token_url)
        self._token: Token | None = None
        self._fetching: asyncio.Future[Token] | None = None
        self.fetches = 0

    async def token(self) -> str:
        """A token that is not due for refresh; fetches one (once for all waiting) if need be."""
        held = self._token
        if held is not None and self._clock() < held.refresh_at:
            return held.value
        if self._fetching is None:
            self._fetching = asyncio.ensure_future(self._fetch())
        fetching = self._fetching
        try:
            token = await asyncio.shield(fetching)
        finally:
            if fetching.done() and self._fetching is fetching:
                self._fetching = None
        return token.value

    def drop(self, value: str) -> None:
        """The endpoint refused ``value`` (401): the next call fetches a new token."""
        if self._token is not None and self._token.value == value:
            self._token = None

    async def _fetch(self) -> Token:
        headers, body = token_request(self.credentials)
        self.fetches += 1
        try:
            response = await self._client.request(
                "POST", self._target, headers, body, TOKEN_TIMEOUT_S, self.route, read_body=True
            )
        except RefusedAddress:
            raise  # the token URL resolves inward: refused like an endpoint that does
        except HttpError as exc:
            raise TokenError(f"oauth2: token endpoint: {exc.reason}") from None
        token = parse_token(response.status, response.excerpt, self._clock())
        self._token = token
        return token
