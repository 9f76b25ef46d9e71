"""Webhook calls authorized by OAuth2 client credentials (delivery/oauth2.py), against a real
token endpoint over TLS and an endpoint that checks the tokens."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from delivery.egress import Route
from delivery.http import HttpClient
from delivery.oauth2 import REFRESH_BEFORE_S, TokenError, TokenSource, parse_token
from delivery.webhook import WebhookSender
from setu.addresses import Resolver
from setu.envelope import Envelope
from setu.model import Endpoint, EndpointTls, OAuth2Credentials, Subscription
from setu.outcome import Verdict
from tests.http_servers import ProtectedEndpoint, TokenServer, serving
from tests.tls_material import Authority, server_context


async def local(host: str, port: int) -> list[str]:
    return ["127.0.0.1"]


RESOLVER: Resolver = local


@dataclass
class Stack:
    ca: Authority
    tokens: TokenServer
    endpoint: ProtectedEndpoint
    client: HttpClient

    def credentials(self, **changes: object) -> OAuth2Credentials:
        values: dict[str, object] = {
            "token_url": f"https://localhost:{self.tokens.port}/oauth/token",
            "client_id": self.tokens.client_id,
            "client_secret": self.tokens.client_secret,
            "scopes": ("events:write", "orders"),
            "audience": "https://orders.example",
            **changes,
        }
        return OAuth2Credentials(**values)  # type: ignore[arg-type]

    def subscription(self, **changes: object) -> Subscription:
        endpoint = Endpoint(
            f"http://localhost:{self.endpoint.port}/hook",
            tls=EndpointTls(ca_certificate=self.ca.certificate),
            oauth2=self.credentials(**changes),
        )
        return Subscription("p", "s", "t", endpoint)


@pytest.fixture
async def stack() -> AsyncIterator[Stack]:
    ca = Authority()
    tokens = TokenServer()
    endpoint = ProtectedEndpoint(tokens)
    async with (
        serving(tokens, server_context(ca.server("localhost"))),
        serving(endpoint, None),
    ):
        client = HttpClient(allow_private=True, resolver=RESOLVER)
        yield Stack(ca, tokens, endpoint, client)
        client.close()


async def test_calls_carry_a_token_fetched_once_with_the_grants_form(stack: Stack) -> None:
    sender = WebhookSender(stack.subscription(), stack.client)
    outcomes = await asyncio.gather(*(sender.send(Envelope(f"m{i}", b"{}"), 1) for i in range(5)))
    assert [o.verdict for o in outcomes] == [Verdict.DELIVERED] * 5
    # One grant for the five concurrent calls, with the scopes and audience, the client
    # authenticated by HTTP Basic (its secret's odd characters form-encoded first)
    assert stack.tokens.forms == [
        {
            "grant_type": "client_credentials",
            "scope": "events:write orders",
            "audience": "https://orders.example",
        }
    ]
    assert set(stack.endpoint.seen) == {f"Bearer {stack.tokens.issued[0]}"}


async def test_a_client_that_authenticates_in_the_form(stack: Stack) -> None:
    sender = WebhookSender(stack.subscription(client_auth="post", scopes=()), stack.client)
    assert (await sender.send(Envelope("m1", b"{}"), 1)).verdict is Verdict.DELIVERED
    assert stack.tokens.forms[0]["client_id"] == "setu"


async def test_a_revoked_token_is_replaced_once_on_401_and_the_call_delivered(
    stack: Stack,
) -> None:
    sender = WebhookSender(stack.subscription(), stack.client)
    assert (await sender.send(Envelope("m1", b"{}"), 1)).verdict is Verdict.DELIVERED
    # When the endpoint stops accepting the token (revoked before its expiry)
    stack.tokens.revoked.add(stack.tokens.issued[0])
    outcome = await sender.send(Envelope("m2", b"{}"), 1)
    # Then the call got a 401, a new token was fetched, and the call made again went through
    assert outcome.verdict is Verdict.DELIVERED
    assert len(stack.tokens.issued) == 2
    assert stack.endpoint.seen[-2:] == [
        f"Bearer {stack.tokens.issued[0]}",
        f"Bearer {stack.tokens.issued[1]}",
    ]


async def test_an_endpoint_that_refuses_every_token_fails_the_call_after_one_refresh(
    stack: Stack,
) -> None:
    sender = WebhookSender(stack.subscription(), stack.client)
    stack.tokens.accepts = lambda authorization: False  # type: ignore[method-assign]
    outcome = await sender.send(Envelope("m1", b"{}"), 1)
    assert (outcome.verdict, outcome.status) == (Verdict.DEAD_LETTER, 401)
    assert len(stack.tokens.issued) == 2  # the first token, and one refresh: no loop


async def test_a_failing_token_endpoint_is_a_retryable_failure_naming_it(stack: Stack) -> None:
    stack.tokens.failing = True
    sender = WebhookSender(stack.subscription(), stack.client)
    outcome = await sender.send(Envelope("m1", b"{}"), 1)
    assert outcome.verdict is Verdict.RETRY
    assert "token endpoint answered 503: temporarily_unavailable" in (outcome.error or "")
    assert stack.endpoint.seen == []  # the endpoint was never called without a token


async def test_wrong_client_credentials_are_named_and_never_echoed(stack: Stack) -> None:
    sender = WebhookSender(stack.subscription(client_secret="nope-123"), stack.client)
    outcome = await sender.send(Envelope("m1", b"{}"), 1)
    assert outcome.verdict is Verdict.RETRY
    assert "invalid_client" in (outcome.error or "")
    assert "nope-123" not in (outcome.error or "")
    assert "nope-123" not in repr(stack.credentials(client_secret="nope-123"))


async def test_a_token_is_fetched_again_before_it_expires(stack: Stack) -> None:
    now = [0.0]
    stack.tokens.expires_in = 600
    route = Route(EndpointTls(ca_certificate=stack.ca.certificate))
    source = TokenSource(stack.credentials(), stack.client, route, clock=lambda: now[0])
    first = await source.token()
    now[0] = 600 * 0.8 - 1  # before 80 % of its lifetime: kept
    assert await source.token() == first
    now[0] = 600 * 0.8
    assert await source.token() != first
    assert source.fetches == 2


@pytest.mark.parametrize(
    ("status", "body", "error"),
    [
        (200, b'{"access_token": "t", "token_type": "mac"}', "not bearer"),
        (200, b'{"token_type": "Bearer"}', "without an access_token"),
        (200, b"<html>", "without a JSON object"),
        (400, b'{"error": "invalid_scope"}', "answered 400: invalid_scope"),
    ],
)
def test_answers_that_are_not_tokens_are_named(status: int, body: bytes, error: str) -> None:
    with pytest.raises(TokenError, match=error):
        parse_token(status, body, 0.0)


def test_refresh_times_follow_the_tokens_lifetime() -> None:
    assert parse_token(200, b'{"access_token": "t", "expires_in": 3600}', 0).refresh_at == 2880
    # Short-lived: 80 % of it, never later than a minute before its end
    assert parse_token(200, b'{"access_token": "t", "expires_in": 100}', 0).refresh_at == 40
    assert REFRESH_BEFORE_S == 60
    # No lifetime given: five minutes assumed; as a string: read
    assert parse_token(200, b'{"access_token": "t"}', 0).refresh_at == 240
    assert parse_token(200, b'{"access_token": "t", "expires_in": "100"}', 0).refresh_at == 40
