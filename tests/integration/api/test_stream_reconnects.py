"""A producer that loses its connection opens its stream again (docs/streaming.md,
"Reconnecting"): from a new connection, soon after the old one closed however it closed, and
nothing it sent is lost or doubled."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import socket
import struct
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import pytest_asyncio
import redis

from cli.ports import any_free_port
from cli.processes import Child, ChildSpec
from setu.client import AsyncStreamProducer
from setu.envelope import H_PRODUCED_AT, H_SEQUENCE_ID
from setu.names import ingest_topic
from setu.settings import Settings
from setu.stream import frames
from state import keys, migrate
from state.producer_marks import ProducerMarks, parse_mark
from tests.integration.api.streams import Raw, message
from tests.integration.api.support import (
    ADMIN_KEY,
    SECRET_KEY,
    drop_project,
    headers_of,
    read_records,
    record_count,
    unique,
)
from tests.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

ROUNDS = int(os.environ.get("SETU_RECONNECT_ROUNDS", "200"))
WAIT_S = float(os.environ.get("SETU_RECONNECT_WAIT_S", "0.3"))
# The API's idle timeout here: a client gone silent holds its stream this long.
IDLE_S = 1.0
DROPPING_ROUNDS = 60
DROPS = ("close", "reset", "eos then close", "close at once", "go silent")


@dataclass
class ApiProcess:
    """``setu api`` in a process of its own, as it runs in production (on uvloop)."""

    base_url: str
    stream_port: int
    kafka_bootstrap: str
    child: Child

    def signal(self, sig: signal.Signals) -> None:
        assert self.child.pid is not None
        os.kill(self.child.pid, sig)

    def client(self) -> httpx.AsyncClient:
        auth = {"Authorization": f"Bearer {ADMIN_KEY}"}
        return httpx.AsyncClient(base_url=self.base_url, headers=auth, timeout=30)


@contextlib.contextmanager
def api_process(
    data_dir: Path, kafka_bootstrap: str, redis_url: str, database_url: str, **settings: str
) -> Iterator[ApiProcess]:
    """``setu api`` on free ports, with the streaming listener and ``SETU_*`` ``settings``."""
    http_port, stream_port = any_free_port(), any_free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("SETU_")},
        "SETU_DATA_DIR": str(data_dir),
        "SETU_KAFKA_BOOTSTRAP": kafka_bootstrap,
        "SETU_REDIS_URL": redis_url,
        "SETU_DATABASE_URL": database_url,
        "SETU_API_HOST": "127.0.0.1",
        "SETU_API_PORT": str(http_port),
        "SETU_STREAM_PORT": str(stream_port),
        "SETU_ADMIN_KEY": ADMIN_KEY,
        "SETU_SECRET_KEY": SECRET_KEY,
        **{f"SETU_{name.upper()}": value for name, value in settings.items()},
    }
    argv = (sys.executable, "-m", "cli.main", "api")
    child = Child(ChildSpec("api", argv, data_dir / "api.log", env=env, stop_timeout_s=15))
    child.start()
    base_url = f"http://127.0.0.1:{http_port}"

    def healthy() -> bool:
        assert child.running, child.log_tail(30)
        with contextlib.suppress(httpx.HTTPError):
            return httpx.get(f"{base_url}/v1/health").status_code == 200
        return False

    try:
        wait_for("the API process serving", healthy, timeout_s=60)
        yield ApiProcess(base_url, stream_port, kafka_bootstrap, child)
    finally:
        if child.pid is not None and child.running:
            os.kill(child.pid, signal.SIGCONT)  # a stopped replica must run to stop
        child.stop()


def migrated(data_dir: Path) -> str:
    """A migrated SQLite store in ``data_dir``: its URL."""
    url = Settings(data_dir=data_dir).resolved_database_url()
    migrate.upgrade(url)
    return url


@pytest.fixture(scope="module")
def api(
    kafka_bootstrap: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ApiProcess]:
    data_dir = tmp_path_factory.mktemp("reconnect-api")
    idle_ms = str(round(IDLE_S * 1000))
    with api_process(
        data_dir, kafka_bootstrap, redis_url, migrated(data_dir), stream_idle_timeout_ms=idle_ms
    ) as running:
        yield running


@pytest_asyncio.fixture(loop_scope="module")
async def project(api: ApiProcess) -> AsyncIterator[str]:
    name = unique()
    async with api.client() as http:
        assert (await http.post("/v1/projects", json={"name": name})).status_code == 201
        created = await http.post(
            f"/v1/projects/{name}/topics", json={"name": "t", "grouped": True, "partitions": 3}
        )
        assert created.status_code == 201, created.text
        yield name
        await drop_project(http, name)


def drop(raw: Raw, how: str) -> None:
    """Ends the connection as a producer that goes away would: FIN, or RST (a process killed
    with data unread, a load balancer's reset)."""
    if how == "reset":
        sock: socket.socket = raw.writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        raw.writer.transport.abort()
    else:
        raw.writer.write_eof()  # FIN, before close() may answer unread data with a RST
        raw.writer.close()


async def reopen(port: int, name: bytes, patience_s: float) -> tuple[Raw, int, float]:
    """A new connection that NOTIFYs ``name`` every 0.1 s until it is granted: the connection,
    the point NOTIFY_ACK gave and how long it took."""
    began = time.monotonic()
    raw = await Raw.connect(port)
    assert isinstance(await raw.next(), frames.Ok)
    stream_id = 1
    while True:
        raw.send(frames.Notify(stream_id, name, 0))
        ack = await raw.until(frames.NotifyAck)
        assert isinstance(ack, frames.NotifyAck)
        if ack.success:
            return raw, ack.point_of_reference, time.monotonic() - began
        waited = time.monotonic() - began
        assert waited < patience_s, f"stream still refused {waited:.1f} s later"
        await asyncio.sleep(0.1)


async def test_a_dropped_connection_never_locks_its_stream_and_loses_nothing(
    api: ApiProcess, project: str
) -> None:
    # (SETU_RECONNECT_SEED replays a failed run's choices; its seed is in the failure)
    seed = int(os.environ.get("SETU_RECONNECT_SEED") or random.randrange(2**32))
    rng = random.Random(seed)
    name = f"{project}/t/rc".encode()
    raw, point, _ = await reopen(api.stream_port, name, 5.0)
    unsure: list[int] = []  # ids sent that the last NOTIFY_ACK did not say are durable
    next_id = 0
    waits: list[tuple[float, str]] = []
    silent: list[Raw] = []  # connections that went quiet without closing
    for _ in range(ROUNDS):
        # Given a session that resends what is not durable yet and sends 1 to 3 new messages
        fresh = list(range(next_id, next_id + rng.randint(1, 3)))
        next_id += len(fresh)
        unsure = [n for n in unsure if n >= point] + fresh
        raw.send(*[message(n, group=f"g{n % 4}") for n in unsure])
        how = rng.choice(DROPS)
        if how == "eos then close":
            raw.send(frames.EosMessage(1, unsure[-1]))
        if how != "close at once":
            await asyncio.sleep(rng.uniform(0, WAIT_S))
        # When its connection goes away, without waiting for any ACK, or just goes quiet (a
        # pulled cable, a frozen process: the socket stays open)
        if how == "go silent":
            silent.append(raw)
        else:
            drop(raw, "reset" if how == "reset" else "close")
        # Then a new connection gets the stream within 2 s, resuming where Kafka stands; after
        # the idle timeout too, when the old connection went quiet
        raw, point, waited = await reopen(api.stream_port, name, 15.0)
        waits.append((waited - (IDLE_S if how == "go silent" else 0.0), how))
        assert point <= next_id
    raw.send(*[message(n, group=f"g{n % 4}") for n in unsure if n >= point])
    raw.send(frames.EosMessage(1, next_id - 1))
    while not any(a == (1, next_id) for f in raw.seen if isinstance(f, frames.Ack) for a in f.acks):
        await raw.until(frames.Ack)
    raw.close()
    for quiet in silent:
        assert await quiet.closed()  # the server ended it
    slowest = sorted(waits, reverse=True)[:5]
    print(f"seed {seed}: slowest reopenings {slowest}")
    assert slowest[0][0] <= 2.0, f"seed {seed}: slowest reopenings {slowest}"
    # And every message is in the ingest topic once
    topic = ingest_topic(project, "t")
    count = await asyncio.to_thread(record_count, api.kafka_bootstrap, topic)
    records = await asyncio.to_thread(read_records, api.kafka_bootstrap, topic, count)
    ids = Counter(int(headers_of(r)[H_SEQUENCE_ID]) for r in records)
    doubled = sorted(n for n, c in ids.items() if c > 1)
    where = [
        (n, r.partition(), r.offset(), headers_of(r).get(H_PRODUCED_AT), r.timestamp()[1])
        for r in records
        for n in [int(headers_of(r)[H_SEQUENCE_ID])]
        if n in doubled
    ]
    assert doubled == [], f"seed {seed}: doubled {where}; log {api.child.spec.log_path}"
    assert sorted(ids) == list(range(next_id)), f"seed {seed}: missing or extra ids"
    assert count == next_id


async def acked_to(raw: Raw, point: int) -> None:
    """Returns once an ACK said stream 1 stands at ``point``."""
    while not any(a == (1, point) for f in raw.seen if isinstance(f, frames.Ack) for a in f.acks):
        await raw.until(frames.Ack)


async def test_an_idle_producer_keeps_its_session_past_the_idle_timeout(
    api: ApiProcess, project: str
) -> None:
    # Given a producer that sends one message, then nothing for three idle timeouts
    producer = AsyncStreamProducer(f"127.0.0.1:{api.stream_port}", ADMIN_KEY, project, "t", "idle")
    await producer.start()
    await producer.send(b"first", group_id="g")
    await producer.flush()
    await asyncio.sleep(3 * IDLE_S)
    # When it sends again, then its message goes out on the same session
    await producer.send(b"second", group_id="g")
    await producer.flush()
    assert producer.durable == 2
    assert producer.reconnects == 0
    await producer.close()


LEASE_S = 3.0


@pytest.mark.parametrize("fate", [signal.SIGSTOP, signal.SIGKILL], ids=["stopped", "killed"])
async def test_a_stream_on_a_replica_that_stops_or_dies_opens_on_another_within_the_lease(
    kafka_bootstrap: str, redis_url: str, tmp_path: Path, fate: signal.Signals
) -> None:
    # Given two API replicas on one store and Redis, and a stream open on the first with 10
    # messages durable and 5 more sent
    database_url = migrated(tmp_path)
    lease = {"stream_lease_ms": str(round(LEASE_S * 1000))}
    with (
        api_process(tmp_path / "a", kafka_bootstrap, redis_url, database_url, **lease) as first,
        api_process(tmp_path / "b", kafka_bootstrap, redis_url, database_url, **lease) as second,
    ):
        project = unique()
        async with first.client() as http:
            assert (await http.post("/v1/projects", json={"name": project})).status_code == 201
            made = await http.post(
                f"/v1/projects/{project}/topics", json={"name": "t", "grouped": True}
            )
            assert made.status_code == 201, made.text
        name = f"{project}/t/moving".encode()
        old, point, _ = await reopen(first.stream_port, name, 5.0)
        assert point == 0
        old.send(*[message(n, group=f"g{n % 3}") for n in range(10)])
        await acked_to(old, 10)
        old.send(*[message(n, group=f"g{n % 3}") for n in range(10, 15)])
        # When the first replica is stopped (SIGSTOP) or killed (SIGKILL)
        first.signal(fate)
        # Then a session on the second gets the stream within the lease
        raw, point, waited = await reopen(second.stream_port, name, LEASE_S + 10)
        assert waited <= LEASE_S + 1.0, f"{waited:.1f} s"
        # (from the point the first last recorded, each second: what it wrote since goes again,
        # and ingest drops the resends as duplicates)
        assert 0 <= point <= 15
        # And resending what it does not hold completes the stream
        raw.send(*[message(n, group=f"g{n % 3}") for n in range(point, 15)])
        raw.send(frames.EosMessage(1, 14))
        await acked_to(raw, 15)
        raw.close()
        if fate == signal.SIGSTOP:
            # And the stopped replica, once it runs again, ends its old session: its lease is gone
            first.signal(signal.SIGCONT)
            assert await old.closed()
            errors = [f for f in old.seen if isinstance(f, frames.Error)]
            assert errors and b"lease" in errors[0].reason, old.seen
        old.close()
        # And nothing was lost (ingest drops a resend of what the first replica had written)
        topic = ingest_topic(project, "t")
        count = await asyncio.to_thread(record_count, kafka_bootstrap, topic)
        records = await asyncio.to_thread(read_records, kafka_bootstrap, topic, count)
        assert {int(headers_of(r)[H_SEQUENCE_ID]) for r in records} == set(range(15))


async def test_a_producer_whose_connection_keeps_dropping_reopens_at_once_and_loses_nothing(
    api: ApiProcess, project: str
) -> None:
    # Given a producer sending 125 messages a second
    producer = AsyncStreamProducer(f"127.0.0.1:{api.stream_port}", ADMIN_KEY, project, "t", "drops")
    await producer.start()
    sending = True

    async def send() -> None:
        while sending:
            await producer.send(b"m", group_id=f"g{producer.next_sequence % 5}")
            await asyncio.sleep(1 / 125)

    sender = asyncio.create_task(send())
    rng = random.Random()
    reopenings: list[float] = []
    for n in range(DROPPING_ROUNDS):
        # When its connection drops (FIN or RST) at a random moment
        await asyncio.sleep(rng.uniform(0.05, 0.5))
        before = producer.reconnects
        dropped = time.monotonic()
        producer.reconnect(reset=n % 2 == 0)
        # Then it has the stream open again on a new connection at once
        while producer.reconnects == before or not producer.connected:
            assert time.monotonic() - dropped < 15, "not reconnected in 15 s"
            await asyncio.sleep(0.01)
        reopenings.append(time.monotonic() - dropped)
    sending = False
    await sender
    await producer.close()
    reopenings.sort()
    print(f"reopenings: median {reopenings[len(reopenings) // 2]:.3f} s, slowest {reopenings[-3:]}")
    # (the old session first waits for Kafka's reports of what it wrote: on a loaded machine
    # they may take a second or two; a lease left held would take its 10 s TTL)
    assert reopenings[len(reopenings) // 2] <= 0.5 and reopenings[-1] <= 5.0, reopenings[-3:]
    # And every message is in the ingest topic once
    sent = producer.next_sequence
    topic = ingest_topic(project, "t")
    assert await asyncio.to_thread(record_count, api.kafka_bootstrap, topic) == sent
    records = await asyncio.to_thread(read_records, api.kafka_bootstrap, topic, sent)
    assert sorted(int(headers_of(r)[H_SEQUENCE_ID]) for r in records) == list(range(sent))


async def test_a_stream_resumes_below_a_write_lost_with_its_replica_though_a_later_one_was_ingested(
    api: ApiProcess, project: str, redis_url: str
) -> None:
    # Given a stream whose session made 0..139 durable, and a replica that then died with 140
    # and 150 in flight to two partitions: 150 reached Kafka and ingest (which raised the
    # producer mark to 150), 140 never did
    name = f"{project}/t/gappy".encode()
    raw, point, _ = await reopen(api.stream_port, name, 5.0)
    assert point == 0
    raw.send(*[message(n, group=f"g{n % 3}") for n in range(140)])
    raw.send(frames.EosMessage(1, 139))
    await acked_to(raw, 140)
    raw.close()
    client = redis.Redis.from_url(redis_url)
    try:
        points = keys.stream_points(project, "t")
        wait_for("the stream point recorded", lambda: client.hget(points, "gappy") is not None)
        recorded = client.hget(points, "gappy")
        assert recorded is not None
        incarnation, sequence = parse_mark(recorded)
        assert sequence == 139
        ProducerMarks(client).raise_marks(project, "t", {"gappy": (incarnation, 150)})
    finally:
        client.close()
    # When the producer, which numbers its messages from its own source, opens the stream again
    producer = AsyncStreamProducer(f"127.0.0.1:{api.stream_port}", ADMIN_KEY, project, "t", "gappy")
    # Then it is told to resume at 140, the first message not known to be durable
    assert await producer.start() == 140
    # And what it sends from there reaches the ingest topic: 140 is not lost
    for sequence in range(140, 151):
        await producer.send(b"x", group_id=f"g{sequence % 3}", sequence_id=sequence)
    await producer.close()
    topic = ingest_topic(project, "t")
    count = await asyncio.to_thread(record_count, api.kafka_bootstrap, topic)
    records = await asyncio.to_thread(read_records, api.kafka_bootstrap, topic, count)
    assert {int(headers_of(r)[H_SEQUENCE_ID]) for r in records} == set(range(151))
