"""Authenticated and encrypted transports end to end (docs/security.md §8): a broker whose only
client listener takes SCRAM-SHA-256 logins, a Redis that requires a password, and the whole
path through them as deployed: ``setu api``, ``setu ingest`` and ``setu deliver`` processes
configured by ``SETU_*`` variables alone, a message produced over HTTP and delivered to a
webhook. Clients with a wrong password, or none, are refused.

It runs twice: in clear (SASL_PLAINTEXT, ``redis://``), and over TLS with certificates of a
private authority (SASL_SSL, ``rediss://``), which every client checks, host name included.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import trustme
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient
from cryptography.hazmat.primitives import serialization
from pydantic import SecretStr

from cli.dev import setu_argv
from cli.jars import resolve_kafka_jars
from cli.kafka_local import BrokerTls, KafkaNode, LocalKafka
from cli.ports import any_free_port
from cli.probes import http_ok, kafka_answers, redis_answers
from cli.processes import ChildSpec
from cli.redis_local import LocalRedis, RedisNode, RedisTls
from cli.stack import Stack
from setu.settings import Settings
from state import migrate
from state.sealing import Sealer
from tests.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.spark]

# Spark starts in about 20 s on two cores; the first batch of a new topic follows.
DELIVERY_TIMEOUT_S = 240.0
START_TIMEOUT_S = 120.0
log = logging.getLogger(__name__)
# What the broker logs of a client that could not log in.
FAILED_LOGIN = "Failed authentication with"
# What librdkafka says when the broker cuts off a client that does not log in.
KAFKA_CUT_OFF = "Broker transport failure"
# What a client closed while it logged in writes besides "Broker transport failure": it was in
# the middle of SASL (the mechanism handshake, or the authentication itself), not cut off.
SASL_IN_PROGRESS = (
    "SASL authentication error: SaslAuthenticateRequest failed",
    "mechanism handshake failed",
)


def password() -> str:
    return "pw-" + secrets.token_hex(12)


@dataclass
class Hook:
    """A webhook on loopback that records what it is sent."""

    url: str = ""
    calls: list[tuple[dict[str, str], bytes]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def bodies(self) -> list[bytes]:
        with self.lock:
            return [body for _, body in self.calls]


@pytest.fixture
def hook() -> Iterator[Hook]:
    received = Hook()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            with received.lock:
                received.calls.append(({k.lower(): v for k, v in self.headers.items()}, body))
            self.send_response(200)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    received.url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield received
    server.shutdown()
    server.server_close()


@dataclass(frozen=True)
class Certificates:
    """PEM files: a private authority, and a certificate it signed for 127.0.0.1 with its key
    (PKCS#8), alone and together (the form Kafka's and Setu's keystores take)."""

    authority: Path
    chain: Path
    key: Path
    keystore: Path


def certificates(folder: Path) -> Certificates:
    authority = trustme.CA(key_type=trustme.KeyType.RSA)
    leaf = authority.issue_cert("127.0.0.1")
    key = serialization.load_pem_private_key(leaf.private_key_pem.bytes(), None).private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    chain = b"".join(blob.bytes() for blob in leaf.cert_chain_pems)
    folder.mkdir(parents=True, exist_ok=True)
    files = Certificates(*(folder / name for name in ("ca.pem", "chain.pem", "key.pem", "ks.pem")))
    files.authority.write_bytes(authority.cert_pem.bytes())
    files.chain.write_bytes(chain)
    files.key.write_bytes(key)
    files.keystore.write_bytes(key + chain)
    return files


@dataclass
class Secured:
    """The broker and Redis of this test, and how a client reaches them."""

    stack: Stack
    protocol: str
    bootstrap: str
    redis_url: str
    user: str
    kafka_password: str
    redis_password: str
    logs: Path
    authority: Path | None

    def settings(self) -> dict[str, str]:
        """Setu's Kafka settings for this broker, by field name."""
        found = {
            "kafka_security_protocol": self.protocol,
            "kafka_sasl_mechanism": "SCRAM-SHA-256",
            "kafka_sasl_username": self.user,
            "kafka_sasl_password": self.kafka_password,
        }
        if self.authority is not None:
            found["kafka_ssl_ca_location"] = str(self.authority)
        return found

    def kafka_env(self) -> dict[str, str]:
        return {
            "SETU_KAFKA_BOOTSTRAP": self.bootstrap,
            **{f"SETU_{name.upper()}": value for name, value in self.settings().items()},
        }

    def client_config(self, **changes: str) -> dict[str, str]:
        """A librdkafka client's settings, built as Setu's processes build theirs."""
        settings = Settings(**self.settings())  # type: ignore[arg-type]
        return {"bootstrap.servers": self.bootstrap, **settings.kafka_client_config(), **changes}


@pytest.fixture(params=["SASL_PLAINTEXT", "SASL_SSL"])
def secured(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Secured]:
    """A broker (SCRAM users ``broker`` and ``setu``) and a Redis with a password, both on free
    loopback ports, over TLS for SASL_SSL, and stopped after the test."""
    stop = threading.Event()
    stack = Stack(stop, log.info)
    logs = tmp_path / "logs"
    kafka_password, redis_password = password(), password()
    tls = certificates(tmp_path / "tls") if request.param == "SASL_SSL" else None
    node = KafkaNode(
        port=any_free_port(),
        controller_port=any_free_port(),
        data_dir=tmp_path / "kafka" / "data",
        scram_users=(("broker", SecretStr(password())), ("setu", SecretStr(kafka_password))),
        tls=BrokerTls(tls.keystore, tls.authority) if tls else None,
    )
    assert node.protocol == request.param
    libs = resolve_kafka_jars(Settings())[0].parent
    broker = LocalKafka(tmp_path / "kafka", node, libs, logs / "kafka.log", "512m")
    redis_node = RedisNode(
        port=any_free_port(),
        data_dir=tmp_path / "redis" / "data",
        password=SecretStr(redis_password),
        tls=RedisTls(tls.chain, tls.key, tls.authority) if tls else None,
    )
    cache = LocalRedis(tmp_path / "redis", redis_node, logs / "redis.log")
    secured = Secured(
        stack,
        request.param,
        node.bootstrap,
        redis_node.url,
        "setu",
        kafka_password,
        redis_password,
        logs,
        tls.authority if tls else None,
    )
    try:
        broker.prepare()
        cache.prepare()
        config = secured.client_config()
        config.pop("bootstrap.servers")
        stack.start(broker.child_spec(), lambda: kafka_answers(node.bootstrap, config), 90)
        stack.start(cache.child_spec(), lambda: redis_answers(redis_node.url), 30)
        yield secured
    finally:
        stack.stop_all()


def refused(config: dict[str, str]) -> list[KafkaError]:
    """The errors a client with ``config`` meets asking the broker for its topics (which it
    must not get)."""
    errors: list[KafkaError] = []
    quiet = logging.getLogger("tests.refused-client")
    admin = AdminClient({**config, "error_cb": errors.append, "logger": quiet})
    with pytest.raises(KafkaException):
        admin.list_topics(timeout=3)
    admin.poll(0.5)
    return errors


def test_the_whole_path_authenticates_through_the_sasl_listener(
    secured: Secured, hook: Hook, tmp_path: Path
) -> None:
    # When the API, the ingest job and a delivery worker run as processes configured only by
    # SETU_* variables: Kafka through SASL, Redis with its password in the URL
    admin_key = secrets.token_urlsafe(32)
    api_port = any_free_port()
    database_url = f"sqlite:///{tmp_path / 'setu.db'}"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("SETU_")},
        **secured.kafka_env(),
        "SETU_REDIS_URL": secured.redis_url,
        "SETU_DATABASE_URL": database_url,
        "SETU_DATA_DIR": str(tmp_path / "data"),
        "SETU_API_HOST": "127.0.0.1",
        "SETU_API_PORT": str(api_port),
        "SETU_ADMIN_KEY": admin_key,
        "SETU_SECRET_KEY": Sealer.new_key(),
        "SETU_ALLOW_PRIVATE_ENDPOINTS": "true",
        "SETU_SUBSCRIPTION_REFRESH_MS": "300",
        "SETU_SPARK_TRIGGER_MS": "200",
        "SETU_SPARK_TOPIC_REFRESH_MS": "1000",
        "SETU_LOG_LEVEL": "DEBUG",
        "PYTHONUNBUFFERED": "1",
    }
    migrate.upgrade(database_url)
    api = f"http://127.0.0.1:{api_port}"

    def process(name: str) -> ChildSpec:
        return ChildSpec(name, setu_argv(name), secured.logs / f"{name}.log", env=env)

    secured.stack.start(process("ingest"))
    secured.stack.start(process("deliver"))
    secured.stack.start(process("api"), lambda: http_ok(f"{api}/v1/health"), START_TIMEOUT_S)
    auth = {"Authorization": f"Bearer {admin_key}"}
    with httpx.Client(base_url=api, headers=auth, timeout=30) as client:
        components = client.get("/v1/health").json()["components"]
        assert components["kafka"]["ok"] and components["redis"]["ok"], components
        assert client.post("/v1/projects", json={"name": "shop"}).status_code == 201
        topic = {"name": "orders", "grouped": True, "partitions": 2}
        assert client.post("/v1/projects/shop/topics", json=topic).status_code == 201
        sub = {"name": "billing", "topic": "orders", "grouped": True, "endpoint": {"url": hook.url}}
        assert client.post("/v1/projects/shop/subscriptions", json=sub).status_code == 201
        produced = client.post(
            "/v1/projects/shop/topics/orders/produce",
            headers={"X-Message-Id": "m-1", "X-Group-Id": "customer-42"},
            content=json.dumps({"total": 10}).encode(),
        )
        assert produced.is_success, produced.text

        # Then the message arrives at the webhook, through ingest and delivery
        wait_for("the message at the webhook", lambda: hook.bodies(), DELIVERY_TIMEOUT_S, 0.2)
        assert hook.bodies() == [b'{"total": 10}']
        headers = hook.calls[0][0]
        assert headers["x_message_id"] == "m-1"
        assert headers["x_group_id"] == "customer-42"
        # and the API's own reads of Kafka go through the listener too: the delivered message
        # is committed (no lag), nothing was set aside
        status = "/v1/projects/shop/subscriptions/billing/status"
        wait_for("no lag", lambda: client.get(status).json().get("lag") == 0, 30, 0.2)
        assert client.get("/v1/projects/shop/topics/orders").json()["ingest_rejected"] == 0

    # And the broker saw no failed login, and no process of Setu wrote a password into its log
    broker_log = secured.logs / "kafka.log"
    assert FAILED_LOGIN not in broker_log.read_text(errors="replace")
    for name in ("api", "ingest", "deliver"):
        text = (secured.logs / f"{name}.log").read_text(errors="replace")
        # A client that does not log in at all is not a failed login to the broker: it is
        # cut off, and says so in the log of its process (the ingest job's topic guard, say).
        # (A short-lived reader closed while it authenticated to the group coordinator logs
        # the same words after "SASL authentication error", or after "SASL SCRAM-SHA-256
        # mechanism handshake failed": it was logging in, not cut off.)
        cut_off = [
            line
            for line in text.splitlines()
            if KAFKA_CUT_OFF in line and not any(s in line for s in SASL_IN_PROGRESS)
        ]
        assert not cut_off, (name, cut_off[:3])
        assert secured.kafka_password not in text, name
        assert secured.redis_password not in text, name

    # And the listener takes no one else: a client with a wrong password is refused as such (and
    # logged by the broker, whose log had no such line before), one that does not log in too
    wrong = refused(secured.client_config(**{"sasl.password": "not-" + secured.kafka_password}))
    assert any(e.code() == KafkaError._AUTHENTICATION for e in wrong), wrong
    wait_for("the failed login in the broker's log", lambda: FAILED_LOGIN in broker_log.read_text())
    refused({"bootstrap.servers": secured.bootstrap})
    # and Redis refuses a client without its password
    without = secured.redis_url.replace(f":{secured.redis_password}@", "")
    anonymous = redis.Redis.from_url(without)
    with pytest.raises(redis.AuthenticationError):
        anonymous.ping()
    anonymous.close()
