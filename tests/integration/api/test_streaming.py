"""Streaming produce (docs/streaming.md) against the real listener, Kafka and Redis: the
handshake and its key, the mapping of MESSAGE to ingest records, one writer per stream, resume
from NOTIFY_ACK, credits, refusals that write nothing, EOS and RESTART."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
import pytest_asyncio
from redis.asyncio import Redis

from cli.ports import any_free_port
from setu.client import AsyncStreamProducer, StreamError, StreamProducer
from setu.envelope import H_GROUP_ID, H_MESSAGE_ID, H_PRODUCER_ID, H_SEQUENCE_ID
from setu.names import ingest_topic
from setu.stream import frames
from state import keys
from tests.integration.api.support import (
    ADMIN_KEY,
    Api,
    drop_project,
    headers_of,
    read_records,
    record_count,
    running_api,
    unique,
)
from tests.processes import listener_pid, rss_kib
from tests.waiting import wait_for_async

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

CREDITS = 20


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def api(
    kafka_bootstrap: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Api]:
    async with running_api(
        tmp_path_factory.mktemp("stream-api"),
        kafka_bootstrap=kafka_bootstrap,
        redis_url=redis_url,
        stream_port=0,
        stream_credits=CREDITS,
        max_message_bytes=64 * 1024,
    ) as running:
        yield running


@pytest_asyncio.fixture(loop_scope="module")
async def project(api: Api) -> AsyncIterator[str]:
    name = unique()
    assert (await api.client.post("/v1/projects", json={"name": name})).status_code == 201
    created = await api.client.post(
        f"/v1/projects/{name}/topics", json={"name": "t", "grouped": True, "partitions": 3}
    )
    assert created.status_code == 201, created.text
    yield name
    await drop_project(api.client, name)


def address(api: Api) -> str:
    return f"127.0.0.1:{api.app.state.stream.port}"


class Raw:
    """A connection speaking frames by hand, for what a well-behaved client never does."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.cutter = frames.FrameReader()
        self.ready: list[frames.Frame] = []
        self.seen: list[frames.Frame] = []

    @classmethod
    async def open(cls, api: Api, key: str = ADMIN_KEY) -> Raw:
        raw = cls(*await asyncio.open_connection("127.0.0.1", api.app.state.stream.port))
        raw.send(frames.Hello(b"3", key.encode(), b"tests", b"raw"))
        return raw

    def send(self, *sent: frames.Frame) -> None:
        self.writer.write(b"".join(frames.encode(f) for f in sent))

    async def next(self) -> frames.Frame:
        """The next frame; ConnectionError when the server closed the connection."""
        while not self.ready:
            data = await asyncio.wait_for(self.reader.read(65536), 15)
            if not data:
                raise ConnectionError("closed")
            self.ready.extend(self.cutter.feed(data))
        frame = self.ready.pop(0)
        self.seen.append(frame)
        return frame

    async def until(self, kind: type[frames.Frame]) -> frames.Frame:
        while not isinstance(frame := await self.next(), kind):
            pass
        return frame

    async def closed(self) -> bool:
        """True once the server closed the connection (frames before that are skipped)."""
        try:
            while True:
                await self.next()
        except ConnectionError:
            return True

    def close(self) -> None:
        self.writer.close()


def message(sequence: int, group: str | None = "g", body: bytes = b"x") -> frames.Message:
    key = None if group is None else group.encode()
    return frames.Message(1, frames.KEY if key is not None else 0, sequence, None, key, body)


def ingest_records(api: Api, project: str, count: int) -> list:  # type: ignore[type-arg]
    assert api.settings.kafka_bootstrap is not None
    return read_records(api.settings.kafka_bootstrap, ingest_topic(project, "t"), count)


def ingest_count(api: Api, project: str) -> int:
    assert api.settings.kafka_bootstrap is not None
    return record_count(api.settings.kafka_bootstrap, ingest_topic(project, "t"))


async def producer_key(api: Api, project: str, topics: list[str] | None = None) -> str:
    body: dict[str, object] = {"name": unique("k"), "role": "producer"}
    if topics is not None:
        body["topics"] = topics
    created = await api.client.post(f"/v1/projects/{project}/keys", json=body)
    assert created.status_code == 201, created.text
    return str(created.json()["key"])


async def test_streamed_messages_land_in_the_ingest_topic_as_http_produce_writes_them(
    api: Api, project: str
) -> None:
    # Given a producer key and a streaming producer
    key = await producer_key(api, project)
    producer = AsyncStreamProducer(address(api), key, project, "t", "checkout")
    # When it streams 50 messages over 5 groups (more than its 20 credits) and closes
    assert await producer.start() == 0
    for n in range(50):
        await producer.send(f"body-{n}".encode(), group_id=f"g{n % 5}")
    await producer.close()
    # Then Kafka holds each once, with the ids of docs/design.md §11, in order per group
    assert producer.durable == 50
    found = await asyncio.to_thread(ingest_records, api, project, 50)
    assert len(found) == 50
    by_group: dict[str, list[int]] = {}
    for record in found:
        headers = headers_of(record)
        sequence = int(headers[H_SEQUENCE_ID])
        assert headers[H_MESSAGE_ID] == f"checkout:{sequence}".encode()
        assert headers[H_PRODUCER_ID] == b"checkout"
        assert record.key() == headers[H_GROUP_ID] == f"g{sequence % 5}".encode()
        assert record.value() == f"body-{sequence}".encode()
        by_group.setdefault(record.key().decode(), []).append(sequence)
    assert sorted(s for seqs in by_group.values() for s in seqs) == list(range(50))
    assert all(seqs == sorted(seqs) for seqs in by_group.values())
    # And a new session resumes after them
    again = AsyncStreamProducer(address(api), key, project, "t", "checkout")
    assert await again.start() == 50
    await again.close()


async def test_a_wrong_key_gets_error_and_writes_nothing(api: Api, project: str) -> None:
    raw = await Raw.open(api, key="setu_0000000000000000_nope")
    refused = await raw.next()
    assert isinstance(refused, frames.Error)
    assert refused.reason.startswith(b"unauthorized: ")
    assert b"nope" not in refused.reason  # never echoed
    assert await raw.closed()
    # And the client surfaces it without retrying
    producer = AsyncStreamProducer(address(api), "wrong", project, "t", "p")
    with pytest.raises(StreamError) as caught:
        await producer.start()
    assert caught.value.code == "unauthorized"


async def test_a_key_for_other_topics_may_not_notify_this_one(api: Api, project: str) -> None:
    key = await producer_key(api, project, topics=["other"])
    producer = AsyncStreamProducer(address(api), key, project, "t", "p")
    with pytest.raises(StreamError) as caught:
        await producer.start()
    assert caught.value.code == "forbidden"


async def test_an_invalid_message_gets_error_naming_it_and_nothing_after_it_is_written(
    api: Api, project: str
) -> None:
    # Given an open stream
    raw = await Raw.open(api)
    assert isinstance(await raw.next(), frames.Ok)
    raw.send(frames.Notify(1, f"{project}/t/bad".encode(), 0))
    assert await raw.until(frames.NotifyAck) == frames.NotifyAck(True, 1, 0)
    # When message 3 of a grouped topic has no GroupId, among valid ones sent in one burst
    raw.send(*[message(n) for n in range(3)], message(3, group=None), message(4), message(5))
    refused = await raw.until(frames.Error)
    # Then the ERROR names it, the session ends, and only the messages before it are written
    assert refused.reason.startswith(b"invalid_input: stream 1 message 3: X_GROUP_ID")
    assert await raw.closed()
    found = await asyncio.to_thread(ingest_records, api, project, 6)
    assert sorted(int(headers_of(r)[H_SEQUENCE_ID]) for r in found) == [0, 1, 2]


@pytest.mark.parametrize(
    ("name", "code"),
    [
        (b"{project}/t", b"invalid_input"),
        (b"{project}/t/bad\x01id", b"invalid_input"),
        (b"{project}/missing/p", b"not_found"),
    ],
)
async def test_a_bad_stream_name_gets_error(
    api: Api, project: str, name: bytes, code: bytes
) -> None:
    raw = await Raw.open(api)
    assert isinstance(await raw.next(), frames.Ok)
    raw.send(frames.Notify(7, name.replace(b"{project}", project.encode()), 0))
    refused = await raw.until(frames.Error)
    assert refused.reason.startswith(code + b": NOTIFY of stream 7: ")
    assert await raw.closed()


async def test_one_writer_per_stream_until_the_first_ends_it(api: Api, project: str) -> None:
    # Given a session writing a stream
    first = AsyncStreamProducer(address(api), ADMIN_KEY, project, "t", "solo")
    await first.start()
    await first.send(b"a", group_id="g")
    await first.flush()
    # When a second session notifies the same stream, then it is refused
    raw = await Raw.open(api)
    assert isinstance(await raw.next(), frames.Ok)
    raw.send(frames.Notify(1, f"{project}/t/solo".encode(), 0))
    assert await raw.until(frames.NotifyAck) == frames.NotifyAck(False, 1, 0)
    # And once the first ends the stream (EOS), the stream is free, resuming after its message
    await first.close()
    raw.send(frames.Notify(2, f"{project}/t/solo".encode(), 0))
    assert await raw.until(frames.NotifyAck) == frames.NotifyAck(True, 2, 1)
    raw.close()


async def test_once_close_returns_the_stream_is_free_for_the_next_session(
    api: Api, project: str
) -> None:
    # Given a producer that hands its stream on to a new session right after close(), 20 times
    for n in range(20):
        producer = AsyncStreamProducer(address(api), ADMIN_KEY, project, "t", "handover")
        assert await producer.start() == n
        await producer.send(b"m", group_id="g")
        await producer.close()
        # When the next session notifies the stream at once
        raw = await Raw.open(api)
        assert isinstance(await raw.next(), frames.Ok)
        raw.send(frames.Notify(1, f"{project}/t/handover".encode(), 0))
        # Then it is granted, never refused as still written by the closed one
        assert await raw.until(frames.NotifyAck) == frames.NotifyAck(True, 1, n + 1)
        raw.close()


async def test_a_resend_below_the_resume_point_is_dropped(api: Api, project: str) -> None:
    # Given 10 messages written and acknowledged
    producer = AsyncStreamProducer(address(api), ADMIN_KEY, project, "t", "again")
    await producer.start()
    for _ in range(10):
        await producer.send(b"first", group_id="g")
    await producer.close()
    # When a new session resends 5..14 after NOTIFY_ACK said 10
    raw = await Raw.open(api)
    assert isinstance(await raw.next(), frames.Ok)
    raw.send(frames.Notify(1, f"{project}/t/again".encode(), 5))
    assert await raw.until(frames.NotifyAck) == frames.NotifyAck(True, 1, 10)
    raw.send(*[message(n, body=b"second") for n in range(5, 15)])
    # Then the ACKs reach 15 and return every credit
    point, credits = 0, 0
    while point < 15 or credits < 11:
        ack = await raw.until(frames.Ack)
        credits += ack.credits
        point = max([p for _, p in ack.acks] + [point])
    assert point == 15
    raw.send(frames.EosMessage(1, 14))
    raw.close()
    # And Kafka holds 0..14 once each: the resent 5..9 were dropped
    found = await asyncio.to_thread(ingest_records, api, project, 16)
    sequences = sorted(int(headers_of(r)[H_SEQUENCE_ID]) for r in found)
    assert sequences == list(range(15))
    assert {r.value() for r in found if int(headers_of(r)[H_SEQUENCE_ID]) < 10} == {b"first"}


async def test_ids_must_increase_within_a_session(api: Api, project: str) -> None:
    raw = await Raw.open(api)
    assert isinstance(await raw.next(), frames.Ok)
    raw.send(frames.Notify(1, f"{project}/t/order".encode(), 0))
    await raw.until(frames.NotifyAck)
    raw.send(message(4), message(4))
    refused = await raw.until(frames.Error)
    assert refused.reason.startswith(b"protocol_error: stream 1 message 4: ids must increase")
    assert await raw.closed()


async def test_spending_more_credits_than_granted_ends_the_session(api: Api, project: str) -> None:
    raw = await Raw.open(api)
    ok = await raw.next()
    assert isinstance(ok, frames.Ok) and ok.initial_credits == CREDITS
    raw.send(frames.Notify(1, f"{project}/t/greedy".encode(), 0))
    # NOTIFY spends one and its NOTIFY_ACK may return it: CREDITS + 1 messages sent before
    # any message's ACK can arrive overspend either way
    raw.send(*[message(n, body=b"m" * 10_000) for n in range(CREDITS + 1)])
    refused = await raw.until(frames.Error)
    assert refused.reason == b"protocol_error: out of credits: wait for an ACK"


async def test_a_frame_over_the_limit_is_refused_before_it_is_read(api: Api) -> None:
    raw = await Raw.open(api)
    assert isinstance(await raw.next(), frames.Ok)
    limit = api.app.state.stream.config.max_frame_bytes
    raw.writer.write((limit + 1).to_bytes(4, "big") + b"\x05")
    refused = await raw.until(frames.Error)
    assert refused.reason.startswith(b"protocol_error: a frame of ")
    assert await raw.closed()


async def test_the_blocking_producer_streams_too(api: Api, project: str) -> None:
    def stream() -> int:
        with StreamProducer(address(api), ADMIN_KEY, project, "t", "sync") as producer:
            for n in range(30):
                producer.send(b"s", group_id=f"g{n % 3}")
            producer.flush()
            return producer.durable

    assert await asyncio.to_thread(stream) == 30
    assert await asyncio.to_thread(ingest_count, api, project) == 30


async def test_shutdown_sends_the_last_ack_then_restart(
    kafka_bootstrap: str, redis_url: str, tmp_path: Path
) -> None:
    # Given an API of its own with a session that wrote 5 messages
    async with running_api(
        tmp_path, kafka_bootstrap=kafka_bootstrap, redis_url=redis_url, stream_port=0
    ) as own:
        project = unique()
        await own.client.post("/v1/projects", json={"name": project})
        await own.client.post(f"/v1/projects/{project}/topics", json={"name": "t", "grouped": True})
        raw = await Raw.open(own)
        assert isinstance(await raw.next(), frames.Ok)
        raw.send(frames.Notify(1, f"{project}/t/p".encode(), 0))
        await raw.until(frames.NotifyAck)
        raw.send(*[message(n) for n in range(5)])
        # When the API shuts down (its lifespan ends) as soon as it has written them
        server = own.app.state.stream

        async def all_written() -> bool:
            return [s.last_id for x in server.sessions for s in x.streams.values()] == [4]

        await wait_for_async("the 5 messages written", all_written)
    # Then the session hears that all 5 are in Kafka, then RESTART, then the end
    received = []
    with pytest.raises(ConnectionError):
        while True:
            received.append(await raw.next())
    points = [p for f in raw.seen if isinstance(f, frames.Ack) for _, p in f.acks]
    assert points and max(points) == 5
    assert isinstance(received[-1], frames.Restart)


async def test_memory_stays_bounded_while_the_broker_is_paused(
    kafka_bootstrap: str, redis_url: str, tmp_path: Path
) -> None:
    # Given an API whose sessions may hold 1 MiB unacknowledged, and a broker that stops
    # answering (SIGSTOP) while two producers each offer 200 messages of 60 KB (24 MB)
    cap, size, offered = 1024 * 1024, 60_000, 200
    broker = listener_pid(int(kafka_bootstrap.rsplit(":", 1)[1]))
    async with running_api(
        tmp_path,
        kafka_bootstrap=kafka_bootstrap,
        redis_url=redis_url,
        stream_port=0,
        stream_credits=CREDITS,
        stream_buffer_bytes=cap,
        max_message_bytes=64 * 1024,
    ) as own:
        project = unique()
        await own.client.post("/v1/projects", json={"name": project})
        await own.client.post(f"/v1/projects/{project}/topics", json={"name": "t", "grouped": True})
        server = own.app.state.stream
        producers = [
            AsyncStreamProducer(f"127.0.0.1:{server.port}", ADMIN_KEY, project, "t", f"p{n}")
            for n in range(2)
        ]
        for producer in producers:
            await producer.start()

        async def offer(producer: AsyncStreamProducer) -> None:
            for n in range(offered):
                await producer.send(b"%06d" % n + b"m" * (size - 6), group_id=f"g{n % 7}")
            await producer.flush()

        os.kill(broker, signal.SIGSTOP)
        try:
            sending = [asyncio.create_task(offer(p)) for p in producers]
            # When the server has read up to its cap
            await wait_for_async("the buffer full", _true_when(lambda: server.buffered >= cap))
            before = rss_kib()
            held = []
            for _ in range(20):
                await asyncio.sleep(0.1)
                held.append(server.buffered)
            # Then it reads no further: the producers wait (they are still sending), the
            # buffer stays within its cap and one read per session, and the process does not
            # grow
            assert not any(task.done() for task in sending)
            assert sum(p.pending for p in producers) <= 2 * CREDITS
            assert max(held) <= cap + len(producers) * (256 * 1024 + size)
            assert rss_kib() - before < 16 * 1024
        finally:
            os.kill(broker, signal.SIGCONT)
        # And once the broker answers again, everything offered is written once
        await asyncio.wait_for(asyncio.gather(*sending), 120)
        assert [p.durable for p in producers] == [offered, offered]
        await asyncio.gather(*(p.close() for p in producers))
        count = await asyncio.to_thread(record_count, kafka_bootstrap, ingest_topic(project, "t"))
        assert count == 2 * offered


def _true_when(condition: Callable[[], bool]) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return condition()

    return check


async def test_a_restarted_replica_frees_the_leases_its_last_run_held(
    kafka_bootstrap: str, redis_url: str, tmp_path: Path
) -> None:
    # Given leases left in Redis by a killed run of this replica (same host, same stream port)
    # and by another replica that may still be writing
    port = any_free_port()
    project = unique()
    client = Redis.from_url(redis_url)
    mine = keys.stream_lease(project, "t", "mine")
    theirs = keys.stream_lease(project, "t", "theirs")
    await client.set(mine, f"{socket.gethostname()}:{port}/killed-run", px=60_000)
    await client.set(theirs, "elsewhere:8070/running", px=60_000)
    try:
        # When the replica starts again on that port
        async with running_api(
            tmp_path, kafka_bootstrap=kafka_bootstrap, redis_url=redis_url, stream_port=port
        ) as own:
            await own.client.post("/v1/projects", json={"name": project})
            await own.client.post(
                f"/v1/projects/{project}/topics", json={"name": "t", "grouped": True}
            )
            raw = await Raw.open(own)
            assert isinstance(await raw.next(), frames.Ok)
            raw.send(
                frames.Notify(1, f"{project}/t/mine".encode(), 0),
                frames.Notify(2, f"{project}/t/theirs".encode(), 0),
            )
            # Then its own old stream is free at once, the other replica's is not
            assert await raw.until(frames.NotifyAck) == frames.NotifyAck(True, 1, 0)
            assert await raw.until(frames.NotifyAck) == frames.NotifyAck(False, 2, 0)
            raw.close()
    finally:
        await client.delete(mine, theirs)
        await client.aclose()


async def test_a_stream_over_its_projects_quota_waits_instead_of_failing(api: Api) -> None:
    # Given a project limited to 10 messages/s
    name = unique()
    made = await api.client.post(
        "/v1/projects", json={"name": name, "quota": {"messages_per_second": 10}}
    )
    assert made.status_code == 201, made.text
    created = await api.client.post(
        f"/v1/projects/{name}/topics", json={"name": "t", "grouped": True, "partitions": 3}
    )
    assert created.status_code == 201, created.text
    try:
        # When a producer streams 25 messages at once
        producer = AsyncStreamProducer(address(api), ADMIN_KEY, name, "t", "quota")
        await producer.start()
        for _ in range(25):
            await producer.send(b"q", group_id="g")
        await producer.close()
        # Then every one was written, once, with no error: the session waited for the quota
        assert await asyncio.to_thread(ingest_count, api, name) == 25
        found = await asyncio.to_thread(ingest_records, api, name, 25)
        assert sorted(int(headers_of(r)[H_SEQUENCE_ID]) for r in found) == list(range(25))
        # And the waits are counted as throttled
        metrics = (await api.client.get("/metrics")).text
        throttled = [
            line
            for line in metrics.splitlines()
            if f'project="{name}"' in line and 'outcome="throttled"' in line
        ]
        assert throttled and float(throttled[0].rsplit(" ", 1)[1]) >= 1
    finally:
        await drop_project(api.client, name)
