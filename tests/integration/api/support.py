"""Helpers for API integration tests: an app on the real services, and reading Kafka back."""

from __future__ import annotations

import secrets
import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Message, TopicPartition
from fastapi import FastAPI

from api.app import create_app
from api.produce import ProduceFastPath
from api.server import uvicorn_options
from setu.addresses import Resolver, system_resolver
from setu.settings import Settings
from state import migrate
from state.sealing import Sealer
from tests.kafka_topics import partitions_of
from tests.waiting import wait_for

# A public address (TEST-NET is not global, so one outside it) that the tests' example
# webhook names resolve to; nothing is ever sent there.
PUBLIC_ADDRESS = "93.184.215.14"


async def public_example_names(host: str, port: int) -> list[str]:
    """``example.com`` and its subdomains resolve to a public address (this machine has no
    DNS); every other name through the system resolver."""
    if host == "example.com" or host.endswith(".example.com"):
        return [PUBLIC_ADDRESS]
    return await system_resolver(host, port)


# The bootstrap admin key of every API the tests start; ``Api.client`` sends it.
ADMIN_KEY = "test-admin-" + secrets.token_urlsafe(24)
# The key sealing stored secrets in every API the tests start.
SECRET_KEY = Sealer.new_key()
# The largest message the module-scoped API of conftest.py accepts.
MAX_MESSAGE_BYTES = 64 * 1024


@dataclass
class Api:
    client: httpx.AsyncClient
    app: FastAPI
    settings: Settings


@asynccontextmanager
async def running_api(
    data_dir: Path, *, fast_path: bool = True, resolver: Resolver | None = None, **settings: Any
) -> AsyncIterator[Api]:
    """A migrated SQLite store in ``data_dir`` and the app's lifespan around a client.
    ``fast_path=False`` leaves produce to the FastAPI routes. Webhook hosts resolve through
    ``resolver``, by default :func:`public_example_names`."""
    resolver = resolver or public_example_names
    config = Settings(
        data_dir=data_dir, **{"admin_key": ADMIN_KEY, "secret_key": SECRET_KEY, **settings}
    )
    migrate.upgrade(config.resolved_database_url())
    app = create_app(config, resolver=resolver)
    if not fast_path:
        app.user_middleware = [m for m in app.user_middleware if m.cls is not ProduceFastPath]
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(
            transport=transport,
            base_url="http://setu",
            headers={"Authorization": f"Bearer {ADMIN_KEY}"},
        ) as client:
            yield Api(client, app, config)


@contextmanager
def served_api(data_dir: Path, **settings: Any) -> Iterator[str]:
    """The API served over real HTTP by uvicorn in a thread, on a migrated SQLite store in
    ``data_dir``; yields its base URL. Webhook hosts resolve as in :func:`running_api`."""
    config = Settings(
        data_dir=data_dir, **{"admin_key": ADMIN_KEY, "secret_key": SECRET_KEY, **settings}
    )
    migrate.upgrade(config.resolved_database_url())
    app = create_app(config, resolver=public_example_names)
    options = uvicorn_options(config.http_head_timeout_ms)
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", **options)
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_for("API serving", lambda: server.started or not thread.is_alive(), 30)
        assert server.started, "the API did not start"
        yield f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(30)


def exchange(port: int, data: bytes, chunk: int = 64 * 1024) -> bytes:
    """Sends ``data`` on a new connection in chunks, stopping early if the server closes;
    returns everything it answered until it closed the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        try:
            for start in range(0, len(data), chunk):
                conn.sendall(data[start : start + chunk])
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered and closed before everything was sent
        return answer_until_closed(conn)


def answer_until_closed(conn: socket.socket) -> bytes:
    """Everything the server sends on ``conn`` until it closes it (the socket's timeout
    fails the test when it does not)."""
    answer = b""
    try:
        while data := conn.recv(65536):
            answer += data
    except ConnectionResetError:
        pass
    return answer


def assert_error(response: httpx.Response, status: int, code: str) -> None:
    """``response`` has ``status`` and the API's error shape with ``code``."""
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}
    assert body["error"]["code"] == code
    assert body["error"]["message"]


def unique(prefix: str = "p") -> str:
    return f"{prefix}{uuid.uuid4().hex[:10]}"


async def drop_project(client: httpx.AsyncClient, project: str) -> None:
    """Deletes a test project with everything in it, Kafka topics included."""
    subs = await client.get(f"/v1/projects/{project}/subscriptions")
    for sub in subs.json().get("subscriptions", []):
        await client.delete(f"/v1/projects/{project}/subscriptions/{sub['name']}")
    topics = await client.get(f"/v1/projects/{project}/topics")
    for topic in topics.json().get("topics", []):
        await client.delete(f"/v1/projects/{project}/topics/{topic['name']}")
    await client.delete(f"/v1/projects/{project}")


def read_records(bootstrap: str, topic: str, count: int, timeout_s: float = 15.0) -> list[Message]:
    """The first ``count`` records of every partition of ``topic`` (blocking; deadline-bound)."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": unique("reader"), "enable.auto.commit": False}
    )
    try:
        partitions = partitions_of(consumer, topic)
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        records: list[Message] = []
        deadline = time.monotonic() + timeout_s
        while len(records) < count and time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is not None and message.error() is None:
                records.append(message)
        return records
    finally:
        consumer.close()


def record_count(bootstrap: str, topic: str, timeout_s: float = 10.0) -> int:
    """How many records ``topic`` holds (sum of high watermarks of a never-compacted topic).
    Retries while a new topic's partition leaders settle."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("counter")})
    deadline = time.monotonic() + timeout_s
    try:
        partitions = partitions_of(consumer, topic)
        while True:
            try:
                return sum(
                    consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=5)[1]
                    for p in partitions
                )
            except KafkaException:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
    finally:
        consumer.close()


def headers_of(message: Message) -> dict[str, bytes]:
    return {name: value or b"" for name, value in message.headers() or []}
