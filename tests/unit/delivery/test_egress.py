"""Calls to protected endpoints (delivery/egress.py): mutual TLS with a client certificate, a
CA of the subscription's own, and an HTTP proxy tunnelled with CONNECT; against real servers
on 127.0.0.1."""

from __future__ import annotations

import asyncio
import re
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
import uvloop

from delivery.egress import Route
from delivery.http import HttpClient, HttpError, RefusedAddress, Target
from delivery.webhook import WebhookSender
from setu.addresses import Resolver
from setu.egress import Egress, Proxy, tls_context
from setu.envelope import Envelope
from setu.model import Endpoint as SubscriptionEndpoint
from setu.model import EndpointTls, Subscription
from setu.outcome import Verdict
from tests.connect_proxy import ConnectProxy, running_proxy
from tests.http_servers import serve_each
from tests.tls_material import Authority, server_context


@dataclass
class Endpoint:
    """Answers 200 with a body; notes each request's host and the client certificate's CN."""

    port: int = 0
    hosts: list[str] = field(default_factory=list)
    connections: int = 0
    clients: list[str | None] = field(default_factory=list)

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        peer = writer.get_extra_info("peercert")
        subject = dict(item[0] for item in peer["subject"]) if peer else {}

        def call(line: str, headers: dict[str, str], body: bytes) -> tuple[str, bytes]:
            self.hosts.append(headers.get("host", ""))
            self.clients.append(subject.get("commonName"))
            return "200 OK", b'{"ok": true}'

        await serve_each(reader, writer, call)


@pytest.fixture
def ca() -> Authority:
    return Authority()


@pytest.fixture
async def plain() -> AsyncIterator[Endpoint]:
    endpoint = Endpoint()
    server = await asyncio.start_server(endpoint.serve, "127.0.0.1", 0)
    endpoint.port = server.sockets[0].getsockname()[1]
    yield endpoint
    server.close()


@pytest.fixture
async def mutual(ca: Authority) -> AsyncIterator[Endpoint]:
    """An https endpoint for ``localhost`` that requires a client certificate signed by ca."""
    endpoint = Endpoint()
    context = server_context(ca.server("localhost"), client_ca=ca.certificate)
    server = await asyncio.start_server(endpoint.serve, "127.0.0.1", 0, ssl=context)
    endpoint.port = server.sockets[0].getsockname()[1]
    yield endpoint
    server.close()


def resolving(answers: dict[str, list[str]]) -> Resolver:
    async def resolve(host: str, port: int) -> list[str]:
        return answers[host]

    return resolve


LOCAL = resolving(
    {"localhost": ["127.0.0.1"], "hook.invalid": ["127.0.0.1"], "127.0.0.1": ["127.0.0.1"]}
)


async def test_an_endpoint_that_requires_a_client_certificate_gets_the_subscriptions(
    ca: Authority, mutual: Endpoint
) -> None:
    client = HttpClient(allow_private=True, resolver=LOCAL)
    url = Target.parse(f"https://localhost:{mutual.port}/hook")
    identity = ca.client("orders-sub")
    with_identity = Route(tls=EndpointTls(identity.certificate, identity.key, ca.certificate))
    # Given no client certificate, the handshake fails and nothing is delivered
    with pytest.raises(HttpError):
        await client.request(
            "POST", url, [], b"x", 5.0, Route(tls=EndpointTls(ca_certificate=ca.certificate))
        )
    assert mutual.hosts == []
    # With the subscription's certificate the call goes through, and the server saw it
    response = await client.request("POST", url, [], b"x", 5.0, with_identity)
    assert response.status == 200
    assert mutual.clients == ["orders-sub"]
    client.close()


async def test_a_server_certificate_of_a_private_ca_is_trusted_only_with_that_ca(
    ca: Authority,
) -> None:
    endpoint = Endpoint()
    context = server_context(ca.server("localhost"))
    server = await asyncio.start_server(endpoint.serve, "127.0.0.1", 0, ssl=context)
    port = server.sockets[0].getsockname()[1]
    client = HttpClient(allow_private=True, resolver=LOCAL)
    url = Target.parse(f"https://localhost:{port}/hook")
    with pytest.raises(HttpError, match="CERTIFICATE_VERIFY_FAILED"):
        await client.request("POST", url, [], b"x", 5.0)
    response = await client.request(
        "POST", url, [], b"x", 5.0, Route(EndpointTls(ca_certificate=ca.certificate))
    )
    assert response.status == 200
    # And the certificate is still checked against the endpoint's host name
    other = Target.parse(f"https://hook.invalid:{port}/hook")
    with pytest.raises(HttpError, match=r"CERTIFICATE_VERIFY_FAILED|match"):
        await client.request(
            "POST", other, [], b"x", 5.0, Route(EndpointTls(ca_certificate=ca.certificate))
        )
    server.close()
    client.close()


def test_a_key_that_is_not_the_certificates_is_refused(ca: Authority) -> None:
    one, other = ca.client("a"), ca.client("b")
    with pytest.raises(ssl.SSLError):
        tls_context(EndpointTls(one.certificate, other.key))
    with pytest.raises(ValueError, match="private key"):
        tls_context(EndpointTls(one.certificate, None))


async def test_a_call_through_the_proxy_asks_it_for_the_checked_address_not_the_name(
    plain: Endpoint,
) -> None:
    async with running_proxy(ConnectProxy()) as proxy:
        client = HttpClient(allow_private=True, resolver=LOCAL)
        url = Target.parse(f"http://hook.invalid:{plain.port}/hook")
        route = Route(proxy=Proxy.parse(proxy.url))
        for _ in range(3):
            response = await client.request("POST", url, [], b"x", 5.0, route)
            assert response.status == 200
            await asyncio.sleep(0)
        # One tunnel, to the address Setu resolved and checked; the request still names the
        # endpoint's host
        assert proxy.asked == [f"127.0.0.1:{plain.port}"]
        assert all(host.startswith("hook.invalid:") for host in plain.hosts)
        client.close()


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_mutual_tls_runs_end_to_end_inside_the_proxys_tunnel(ca: Authority, loop: str) -> None:
    # On both loops: the worker runs uvloop, whose transports are handed from the tunnel's
    # opening to TLS and then to the HTTP connection
    async def scenario() -> tuple[int, bytes, list[str], list[str | None]]:
        endpoint = Endpoint()
        context = server_context(ca.server("localhost"), client_ca=ca.certificate)
        server = await asyncio.start_server(endpoint.serve, "127.0.0.1", 0, ssl=context)
        endpoint.port = server.sockets[0].getsockname()[1]
        async with running_proxy(ConnectProxy(allowed_ports={endpoint.port})) as proxy:
            client = HttpClient(allow_private=True, resolver=LOCAL)
            identity = ca.client("tunnelled")
            route = Route(
                EndpointTls(identity.certificate, identity.key, ca.certificate),
                Proxy.parse(proxy.url),
            )
            url = Target.parse(f"https://localhost:{endpoint.port}/hook")
            response = await client.request("POST", url, [], b"x", 5.0, route, read_body=True)
            client.close()
        server.close()
        return response.status, response.excerpt, proxy.asked, endpoint.clients

    status, body, asked, clients = (uvloop.run if loop == "uvloop" else asyncio.run)(scenario())
    assert (status, body) == (200, b'{"ok": true}')
    assert asked == [f"127.0.0.1:{asked[0].rsplit(':', 1)[1]}"]
    assert clients == ["tunnelled"]


@pytest.mark.parametrize("answer", [["127.0.0.1"], ["10.0.0.7"], ["169.254.169.254"]])
async def test_the_address_rule_holds_through_a_proxy(answer: list[str]) -> None:
    # Given a proxy that would reach anything, and a name that resolves inward
    async with running_proxy(ConnectProxy()) as proxy:
        client = HttpClient(resolver=resolving({"hooks.example.com": answer, "127.0.0.1": []}))
        url = Target.parse("http://hooks.example.com:8080/hook")
        # Then the call is refused before the proxy is even asked
        with pytest.raises(RefusedAddress):
            await client.request("POST", url, [], b"x", 5.0, Route(proxy=Proxy.parse(proxy.url)))
        assert proxy.asked == []
        client.close()


async def test_proxy_credentials_from_its_url_and_its_refusals_are_named(
    plain: Endpoint,
) -> None:
    required = Proxy.parse("http://setu:s3cret@127.0.0.1:1").authorization
    async with running_proxy(ConnectProxy(authorization=required)) as proxy:
        client = HttpClient(allow_private=True, resolver=LOCAL)
        url = Target.parse(f"http://hook.invalid:{plain.port}/hook")
        good = Proxy.parse(f"http://setu:s3cret@127.0.0.1:{proxy.port}")
        bad = Proxy.parse(f"http://setu:wrong@127.0.0.1:{proxy.port}")
        assert (await client.request("POST", url, [], b"x", 5.0, Route(proxy=good))).status == 200
        with pytest.raises(HttpError, match=re.escape("proxy answered 'HTTP/1.1 407")) as failed:
            await client.request("POST", url, [], b"x", 5.0, Route(proxy=bad))
        assert "wrong" not in str(failed.value)
        assert "wrong" not in repr(bad)
        client.close()


def test_a_proxy_url_is_http_with_a_host_and_nothing_else() -> None:
    assert Proxy.parse("http://proxy.corp:8080") == Proxy("proxy.corp", 8080)
    assert Proxy.parse("http://proxy.corp").port == 3128
    for wrong in ("https://proxy.corp", "proxy.corp:3128", "http://proxy.corp/x", "http://"):
        with pytest.raises(ValueError, match="proxy URL"):
            Proxy.parse(wrong)


async def test_a_subscription_goes_through_the_proxy_it_names_or_the_default(
    plain: Endpoint,
) -> None:
    async with (
        running_proxy(ConnectProxy()) as default,
        running_proxy(ConnectProxy()) as named,
    ):
        egress = Egress.parse(default.url, {"eu": named.url})
        client = HttpClient(allow_private=True, resolver=LOCAL)
        url = f"http://hook.invalid:{plain.port}/hook"
        plain_sub = Subscription("p", "a", "t", SubscriptionEndpoint(url))
        eu_sub = Subscription("p", "b", "t", SubscriptionEndpoint(url, proxy="eu"))
        for sub in (plain_sub, eu_sub):
            sender = WebhookSender(sub, client, egress=egress)
            assert (await sender.send(Envelope("m", b"{}"), 1)).verdict is Verdict.DELIVERED
        assert (len(default.asked), len(named.asked)) == (1, 1)
        # A proxy this worker does not know fails the call, saying so, and reaches nobody
        unknown = Subscription("p", "c", "t", SubscriptionEndpoint(url, proxy="us"))
        outcome = await WebhookSender(unknown, client, egress=egress).send(Envelope("m", b""), 1)
        assert outcome.verdict is Verdict.RETRY
        assert "egress proxy 'us' is not configured here" in (outcome.error or "")
        assert len(plain.hosts) == 2
        client.close()


async def test_a_subscription_leaving_a_shared_route_leaves_the_others_connections_open(
    plain: Endpoint,
) -> None:
    # Given two subscriptions calling one endpoint directly, over one kept-alive connection
    async with running_proxy(ConnectProxy()) as proxy:
        client = HttpClient(allow_private=True, resolver=LOCAL)
        url = f"http://hook.invalid:{plain.port}/hook"
        staying = WebhookSender(Subscription("p", "a", "t", SubscriptionEndpoint(url)), client)
        moving_sub = Subscription("p", "b", "t", SubscriptionEndpoint(url))
        moving = WebhookSender(moving_sub, client, egress=Egress.parse(None, {"eu": proxy.url}))
        for sender in (staying, moving, staying):
            assert (await sender.send(Envelope("m", b"{}"), 1)).verdict is Verdict.DELIVERED
            await asyncio.sleep(0)  # the answer ends; the connection goes back to the pool
        assert plain.connections == 1
        # When one of them moves to a proxy
        moving.update(Subscription("p", "b", "t", SubscriptionEndpoint(url, proxy="eu"), version=2))
        # Then the other still calls over its kept-alive connection
        assert (await staying.send(Envelope("m", b"{}"), 1)).verdict is Verdict.DELIVERED
        assert plain.connections == 1
        client.close()
