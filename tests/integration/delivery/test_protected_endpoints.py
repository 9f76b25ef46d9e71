"""Endpoints inside a company's network (docs/security.md §4, "Protected endpoints"): a
subscription made through the API reaches an endpoint that requires a client certificate
and an OAuth2 bearer token, through the installation's egress proxy; on the real broker and
Redis, with a real TLS server, token endpoint and CONNECT proxy."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest

from tests.connect_proxy import ConnectProxy
from tests.http_servers import TokenServer, serve_each
from tests.integration.delivery.support import ThreadWorker, World, serving_api, wait_for
from tests.tls_material import Authority, server_context

pytestmark = pytest.mark.integration


@dataclass
class GuardedEndpoint:
    """An https endpoint that requires a client certificate (TLS) and a bearer token its
    token server issued and did not revoke; notes what each call carried."""

    tokens: TokenServer
    port: int = 0
    accepted: list[str] = field(default_factory=list)  # message ids answered 200, in order
    refused: int = 0
    clients: set[str] = field(default_factory=set)

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peercert") or {}
        self.clients.add(dict(item[0] for item in peer.get("subject", ())).get("commonName", ""))
        await serve_each(reader, writer, self.call)

    def call(self, line: str, headers: dict[str, str], body: bytes) -> tuple[str, bytes]:
        if self.tokens.accepts(headers.get("authorization")):
            self.accepted.append(headers["x_message_id"])
            return "200 OK", b""
        self.refused += 1
        return "401 Unauthorized", b""


@dataclass
class Network:
    """The company's side, served on a loop of its own thread: token server, endpoint, proxy."""

    ca: Authority
    tokens: TokenServer
    endpoint: GuardedEndpoint
    proxy: ConnectProxy


@pytest.fixture
def network() -> Iterator[Network]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    ca = Authority()
    tokens = TokenServer()
    endpoint = GuardedEndpoint(tokens)
    proxy = ConnectProxy()

    async def start() -> list[asyncio.Server]:
        servers = [
            await asyncio.start_server(
                tokens.serve, "127.0.0.1", 0, ssl=server_context(ca.server("localhost"))
            ),
            await asyncio.start_server(
                endpoint.serve,
                "127.0.0.1",
                0,
                ssl=server_context(ca.server("localhost"), client_ca=ca.certificate),
            ),
            await asyncio.start_server(proxy.handle, "127.0.0.1", 0),
        ]
        tokens.port, endpoint.port, proxy.port = (s.sockets[0].getsockname()[1] for s in servers)
        return servers

    servers = asyncio.run_coroutine_threadsafe(start(), loop).result(10)
    try:
        yield Network(ca, tokens, endpoint, proxy)
    finally:

        async def stop() -> None:
            for server in servers:
                server.close()

        asyncio.run_coroutine_threadsafe(stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


def test_a_subscription_reaches_an_endpoint_behind_mtls_oauth2_and_a_proxy_in_order(
    world: World, network: Network, start_worker: Callable[..., ThreadWorker]
) -> None:
    egress = {"egress_proxies": {"corp": network.proxy.url}}
    identity = network.ca.client("setu-orders")
    world.topic("t")
    # Given a subscription made through the API with a client certificate, the company's CA,
    # OAuth2 client credentials and the installation's proxy named "corp"
    with serving_api(world, **egress) as api:
        made = api.post(
            f"/v1/projects/{world.project}/subscriptions",
            json={
                "name": "s",
                "topic": "t",
                "endpoint": {
                    "url": f"https://localhost:{network.endpoint.port}/hook",
                    "tls": {
                        "client_certificate": identity.certificate,
                        "client_key": identity.key,
                        "ca_certificate": network.ca.certificate,
                    },
                    "oauth2": {
                        "token_url": f"https://localhost:{network.tokens.port}/oauth/token",
                        "client_id": network.tokens.client_id,
                        "client_secret": network.tokens.client_secret,
                        "scopes": ["orders:write"],
                    },
                    "proxy": "corp",
                },
                "retry": {"delays_ms": [200, 400]},
            },
        )
        assert made.status_code == 201, made.text
        shown = made.json()["endpoint"]
        assert shown["tls"]["client_certificate"]["subject"] == "CN=setu-orders"
        assert (shown["proxy"], shown["oauth2"]["scopes"]) == ("corp", ["orders:write"])
    first = world.publish("t", "g", 5)
    # When a worker configured with the same proxies runs
    start_worker(**egress)
    # Then every message arrives in order, shown the certificate and a token
    wait_for("the first messages", lambda: network.endpoint.accepted == first, 60)
    assert network.endpoint.clients == {"setu-orders"}
    assert len(network.tokens.issued) == 1
    assert network.tokens.forms[0]["scope"] == "orders:write"
    # And every connection, to the endpoint and to the token server, went through the proxy,
    # asked for an address Setu checked, never for a name
    ports = {network.endpoint.port, network.tokens.port}
    assert {int(a.rsplit(":", 1)[1]) for a in network.proxy.asked} == ports
    assert not any(a.startswith("localhost") for a in network.proxy.asked)
    # When the company revokes the token before its expiry
    network.tokens.revoked.add(network.tokens.issued[0])
    later = world.publish("t", "g", 3)
    # Then the calls refused with 401 get a new token and go through, still in order, with
    # nothing dead-lettered
    wait_for("the later messages", lambda: network.endpoint.accepted == first + later, 60)
    assert len(network.tokens.issued) == 2
    assert network.endpoint.refused >= 1
    assert world.dlq_size() == 0
