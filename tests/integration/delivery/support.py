"""Helpers of the delivery tests (the fixtures in conftest.py build them): a webhook receiver
whose answers each test chooses, a world of one project, and delivery workers in a thread or
as a process."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import secrets
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import redis
from confluent_kafka import Consumer, Producer, TopicPartition
from prometheus_client.parser import text_string_to_metric_families
from pydantic import SecretStr

from delivery.worker import serve
from setu import names
from setu.envelope import Envelope
from setu.errors import Conflict
from setu.model import DeadLetterPolicy, Endpoint, RetryPolicy, Subscription, Topic
from setu.settings import Settings
from state import keys
from state.kafka_admin import KafkaTopics
from state.metadata import MetadataStore
from tests.waiting import wait_for as wait_for

REPO = Path(__file__).resolve().parents[3]


@dataclass(frozen=True)
class Call:
    path: str
    message_id: str
    group: str | None
    attempt: int
    status: int
    headers: dict[str, str]
    body: bytes
    at: float


@dataclass
class Receiver:
    """Records every call; answers 200 unless a rule for the call's group says otherwise. A
    rule is a list of statuses used one per call (the last one repeats), or a callable."""

    calls: list[Call] = field(default_factory=list)
    rules: dict[str, Any] = field(default_factory=dict)
    flaky: dict[str, tuple[int, int]] = field(default_factory=dict)  # see fail_each
    delay_s: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)
    url: str = ""
    active: int = 0  # calls being answered right now
    most_active: int = 0
    peers: set[int] = field(default_factory=set)  # client ports seen (one per connection)
    # Paths whose calls wait, unanswered, until their event is set (an endpoint that hangs).
    hangs: dict[str, threading.Event] = field(default_factory=dict)
    # Each replayed call (docs/replays.md) of a message fails this many times with 503 first.
    replay_failures: int = 0

    def hang_path(self, path: str, until: threading.Event) -> None:
        with self.lock:
            self.hangs[path] = until

    def answer(self, group: str, *statuses: int) -> None:
        with self.lock:
            self.rules[group] = list(statuses)

    def fail_each(self, group: str, times: int, status: int = 503) -> None:
        """A merely flaky endpoint: each message of ``group`` fails its first ``times`` calls
        with ``status``, then gets 200."""
        with self.lock:
            self.flaky[group] = (times, status)

    def heal(self) -> None:
        with self.lock:
            self.rules.clear()
            self.flaky.clear()

    def _status(self, group: str | None, message_id: str, replay: str | None = None) -> int:
        with self.lock:
            if replay is not None and self.replay_failures:
                earlier = sum(
                    1
                    for c in self.calls
                    if c.message_id == message_id and c.headers.get("x_replay_id") == replay
                )
                return 503 if earlier < self.replay_failures else 200
            flaky = self.flaky.get(group or "")
            if flaky is not None:
                earlier = sum(1 for c in self.calls if c.message_id == message_id)
                return flaky[1] if earlier < flaky[0] else 200
            rule = self.rules.get(group or "")
            if rule is None:
                return 200
            if callable(rule):
                return int(rule())
            return int(rule.pop(0) if len(rule) > 1 else rule[0])

    def record(self, call: Call) -> None:
        with self.lock:
            self.calls.append(call)

    def delivered(self, group: str | None = None, path: str | None = None) -> list[str]:
        """Message ids answered 2xx (at ``path`` only, given one), in the order they arrived
        (repeats included)."""
        with self.lock:
            return [
                c.message_id
                for c in self.calls
                if 200 <= c.status < 300
                and (group is None or c.group == group)
                and (path is None or c.path == path)
            ]

    def attempts(self, message_id: str) -> list[Call]:
        with self.lock:
            return [c for c in self.calls if c.message_id == message_id]


def receiver_handler(receiver: Receiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            headers = {k.lower(): v for k, v in self.headers.items()}
            group = headers.get("x_group_id")
            with receiver.lock:
                receiver.active += 1
                receiver.most_active = max(receiver.most_active, receiver.active)
                receiver.peers.add(self.client_address[1])
            if receiver.delay_s:
                time.sleep(receiver.delay_s)
            hang = receiver.hangs.get(self.path)
            if hang is not None:
                hang.wait()
            with receiver.lock:
                receiver.active -= 1
            status = receiver._status(
                group, headers.get("x_message_id", ""), headers.get("x_replay_id")
            )
            receiver.record(
                Call(
                    self.path,
                    headers.get("x_message_id", ""),
                    group,
                    int(headers.get("x_delivery_attempt", "0")),
                    status,
                    headers,
                    body,
                    time.monotonic(),
                )
            )
            # A failure says why, as receivers do (the attempt log keeps its start).
            answer = b"" if 200 <= status < 300 else b'{"refused": %d}' % status
            self.send_response(status)
            self.send_header("content-length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


@contextmanager
def served_receiver(host: str = "127.0.0.1") -> Iterator[Receiver]:
    """A :class:`Receiver` answering at ``host`` on a free port (its ``url`` ends in ``/hook``)
    until the block ends."""
    rec = Receiver()
    server = ThreadingHTTPServer((host, 0), receiver_handler(rec))
    server.daemon_threads = True
    rec.url = f"http://{host}:{server.server_address[1]}/hook"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield rec
    finally:
        server.shutdown()
        server.server_close()


@dataclass
class World:
    """One project with helpers to create topics and subscriptions and to publish."""

    project: str
    bootstrap: str
    redis_url: str
    database_url: str
    store: MetadataStore
    topics: KafkaTopics
    producer: Producer
    # The key the store seals secrets with; workers get it too.
    secret_key: str

    def topic(self, name: str = "t", grouped: bool = True, partitions: int = 2) -> Topic:
        topic = Topic(self.project, name, grouped=grouped, partitions=partitions)
        self.topics.ensure_topic(topic)
        stored, _ = self.store.create_topic(topic)
        return stored

    def subscription(
        self,
        url: str,
        name: str = "s",
        topic: str = "t",
        grouped: bool = True,
        delays_ms: tuple[int, ...] = (200, 400),
        policy: DeadLetterPolicy = DeadLetterPolicy.PARK,
        make_topics: bool = True,
        **extra: Any,
    ) -> Subscription:
        """Stores a subscription, with the Kafka topic the API makes sure of at a create (its
        topic's group-state changelog, made with the topic; its retry tiers and DLQ wait for
        its first copy there) unless ``make_topics`` is False (as when the API answered a
        create and stopped before it made it)."""
        sub = Subscription(
            project=self.project,
            name=name,
            topic=topic,
            endpoint=Endpoint(url, timeout_ms=extra.pop("timeout_ms", 5000)),
            grouped=grouped,
            retry=RetryPolicy(delays_ms=delays_ms),
            dead_letter_policy=policy,
            **extra,
        )
        if make_topics:
            self.topics.ensure_groups(self.store.get_topic(self.project, topic))
        stored, _ = self.store.create_subscription(sub)
        return stored

    def publish(
        self,
        topic: str,
        group: str | None,
        count: int = 1,
        body: Callable[[str], bytes] = str.encode,
        **env: Any,
    ) -> list[str]:
        """Writes ``count`` messages to the main log as the ingest job would; returns ids.
        Each body is ``body(message_id)``, the id itself unless said otherwise."""
        ids = []
        for _ in range(count):
            message_id = f"{group or 'm'}-{uuid.uuid4().hex[:8]}"
            envelope = Envelope(message_id, body(message_id), group_id=group, **env)
            self.producer.produce(
                names.main_topic(self.project, topic),
                value=envelope.body,
                key=envelope.key,
                headers=list[tuple[str, str | bytes | None]](envelope.kafka_headers()),
            )
            ids.append(message_id)
        self.producer.flush(10)
        return ids

    def dlq_size(self, sub: str = "s", partitions: int = 2) -> int:
        """How many records the subscription's DLQ holds (high minus low watermarks)."""
        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": "dlq-size"})
        try:
            topic = names.dlq_topic(self.project, sub)
            if self.topics.partition_count(topic) is None:
                return 0  # made at the subscription's first copy there
            total = 0
            for partition in range(partitions):
                low, high = consumer.get_watermark_offsets(
                    TopicPartition(topic, partition), timeout=10
                )
                total += high - low
            return total
        finally:
            consumer.close()

    def settings(self, **overrides: Any) -> Settings:
        values: dict[str, Any] = {
            "kafka_bootstrap": self.bootstrap,
            "redis_url": self.redis_url,
            "database_url": self.database_url,
            "subscription_refresh_ms": 200,
            "worker_id": f"test-{self.project}",
            # The tests' webhooks listen on loopback.
            "allow_private_endpoints": True,
            "secret_key": self.secret_key,
            # Shared readers (the default, decision 0011), each test's workers in a group of
            # their own; SETU_TEST_DELIVERY_READERS=per-subscription runs these tests on the
            # earlier layout.
            "delivery_readers": os.environ.get("SETU_TEST_DELIVERY_READERS", "shared"),
            "delivery_group": f"setu.delivery.{self.project}",
            # Replays of windows that end as a test produces its last message: the main log
            # has them all at once here (docs/replays.md).
            "replay_settle_ms": 1000,
        }
        values.update(overrides)
        return Settings(**values)

    def redis(self) -> redis.Redis[bytes]:
        return redis.Redis.from_url(self.redis_url)

    def forget_redis(self) -> None:
        """Redis comes back empty (a flush, a failover to a replica that had not caught up)."""
        client = self.redis()
        try:
            client.flushall()
        finally:
            client.close()

    def worker_reports(self, sub: str = "s") -> list[dict[str, Any]]:
        """What the workers running ``sub`` last reported of it (every 1 s or so)."""
        client = self.redis()
        try:
            return [json.loads(v) for v in client.hvals(keys.worker_stats(self.project, sub))]
        finally:
            client.close()


def sub_path(world: World, tail: str, sub: str = "s") -> str:
    """The API path of ``tail`` under the subscription ``sub``."""
    return f"/v1/projects/{world.project}/subscriptions/{sub}/{tail}"


def group_view(api: httpx.Client, world: World, group: str, sub: str = "s") -> dict[str, Any]:
    """``GET …/groups/{group}`` of ``sub``."""
    body: dict[str, Any] = api.get(sub_path(world, f"groups/{group}", sub)).json()
    return body


def parked(api: httpx.Client, world: World, group: str, count: int, sub: str = "s") -> bool:
    """The API shows ``group`` dead-lettered with ``count`` messages parked."""
    body = api.get(sub_path(world, f"groups/{group}", sub)).json()
    return bool(body["state"] == "dead_lettered" and body["parked"] == count)


def delete_subscription_group(topics: KafkaTopics, project: str, subscription: str) -> None:
    """Deletes the subscription's consumer group, repeating the DELETE while a stopped worker
    is still a member (until the broker's session timeout drops it), as the API's 409 asks."""

    def deleted() -> bool:
        try:
            topics.delete_subscription(project, subscription)
        except Conflict:
            return False
        return True

    wait_for(f"consumer group of {subscription} to be deleted", deleted, 90, 1.0)


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The samples a worker serves at /metrics, by name and sorted labels."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def labels(world: World, **more: str) -> tuple[tuple[str, str], ...]:
    """Sorted labels of a sample of the world's subscription ``s``."""
    return tuple(sorted({"project": world.project, "subscription": "s", **more}.items()))


class ThreadWorker:
    """A delivery worker on its own event loop in a thread."""

    def __init__(self, settings: Settings, store: MetadataStore) -> None:
        self._loop = asyncio.new_event_loop()
        self._stop = asyncio.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._main, args=(settings, store), name="delivery-worker", daemon=True
        )
        self._thread.start()

    def _main(self, settings: Settings, store: MetadataStore) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(serve(settings, store, self._stop))
        except BaseException as exc:
            self._error = exc
        finally:
            self._loop.close()

    def stop(self, timeout_s: float = 90.0) -> None:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(timeout_s)
        assert not self._thread.is_alive(), "the worker did not stop"
        if self._error is not None:
            raise self._error


class ProcessWorker:
    """``setu deliver`` as a real process, for tests that kill it."""

    def __init__(self, settings: Settings, log_path: Path) -> None:
        env = dict(os.environ)
        for name, value in settings.model_dump().items():
            if isinstance(value, SecretStr):
                value = value.get_secret_value()
            if value is not None:
                env[f"SETU_{name.upper()}"] = str(value)
        self._log = log_path.open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "cli.main", "deliver"],
            cwd=REPO,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(10)
        self._log.close()

    def terminate(self) -> int:
        self.process.terminate()
        code = self.process.wait(90)
        self._log.close()
        return code


def replace_sub(sub: Subscription, **changes: Any) -> Subscription:
    return dataclasses.replace(sub, **changes)


def three_workers(world: World, start_worker: Callable[..., ThreadWorker]) -> None:
    """Three workers in the subscription's consumer group, each owning partitions."""
    for n in range(3):
        start_worker(worker_id=f"w{n}-{world.project}")
    wait_for(
        "three workers sharing the partitions",
        lambda: sum(1 for r in world.worker_reports() if r["partitions"]) == 3,
    )


class Outage:
    """Every group's calls answer 503 while ``down`` is set."""

    def __init__(self, receiver: Receiver, groups: list[str]) -> None:
        self.down = threading.Event()
        self.down.set()
        with receiver.lock:
            for group in groups:
                receiver.rules[group] = lambda: 503 if self.down.is_set() else 200

    def end(self) -> None:
        self.down.clear()


@contextmanager
def serving_api(world: World, **overrides: Any) -> Iterator[httpx.Client]:
    """The HTTP API on ``world``'s database, Kafka and Redis (and ``overrides`` of its
    settings), served by uvicorn in a thread; a client with the admin key."""
    import uvicorn

    from api.app import create_app

    admin_key = secrets.token_urlsafe(32)
    settings = world.settings(allow_private_endpoints=True, admin_key=admin_key, **overrides)
    app = create_app(settings)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    wait_for("the API to start", lambda: server.started, 30)
    port = sock.getsockname()[1]
    try:
        with httpx.Client(
            base_url=f"http://127.0.0.1:{port}",
            timeout=30,
            headers={"Authorization": f"Bearer {admin_key}"},
        ) as client:
            yield client
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()
