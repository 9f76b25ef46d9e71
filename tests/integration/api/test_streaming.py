"""Streaming produce (docs/streaming.md) against the real listener, Kafka and Redis: the
handshake and its key, the mapping of MESSAGE to ingest records, one writer per stream, resume
from NOTIFY_ACK, credits, refusals that write nothing, EOS and RESTART, and what one caller may
hold of the listener, with a key or without."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
import pytest_asyncio
from redis.asyncio import Redis

from api.stream_server import HELLO_MAX_BYTES
from cli.ports import any_free_port
from setu.client import AsyncStreamProducer, StreamError, StreamProducer
from setu.envelope import (
    H_CONTENT_TYPE,
    H_GROUP_ID,
    H_MESSAGE_ID,
    H_PRODUCER_ID,
    H_SEQUENCE_ID,
    H_TRACEPARENT,
)
from setu.names import ingest_topic
from setu.stream import frames
from state import keys
from tests.integration.api.streams import Raw, address, message, new_project
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
        # The quota test reads its project's throttled count from /metrics.
        metrics_tenant_labels=True,
    ) as running:
        yield running


# The caps of the guarded API: connections without a session, sessions, one key's sessions,
# one session's streams.
PENDING, SESSIONS, PER_KEY, STREAMS = 16, 4, 2, 3


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def guarded(
    kafka_bootstrap: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Api]:
    """An API with small caps on what one caller may hold, and a HELLO timeout long enough
    that connections that never say HELLO stay for a whole test."""
    async with running_api(
        tmp_path_factory.mktemp("guarded-stream-api"),
        kafka_bootstrap=kafka_bootstrap,
        redis_url=redis_url,
        stream_port=0,
        stream_max_pending=PENDING,
        stream_max_sessions=SESSIONS,
        stream_max_sessions_per_key=PER_KEY,
        stream_max_streams_per_session=STREAMS,
        stream_hello_timeout_ms=60_000,
        max_message_bytes=64 * 1024,
    ) as running:
        yield running


@pytest_asyncio.fixture(loop_scope="module")
async def project(api: Api) -> AsyncIterator[str]:
    name = await new_project(api)
    yield name
    await drop_project(api.client, name)


@pytest_asyncio.fixture(loop_scope="module")
async def guarded_project(guarded: Api) -> AsyncIterator[str]:
    name = await new_project(guarded)
    yield name
    await drop_project(guarded.client, name)


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


async def test_streamed_headers_content_type_and_trace_land_as_http_produce_writes_them(
    api: Api, project: str
) -> None:
    # Given a producer streaming one message with X_* headers, a Content-Type and a trace
    # context, and one without
    key = await producer_key(api, project)
    producer = AsyncStreamProducer(address(api), key, project, "t", "eu-shop")
    assert await producer.start() == 0
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    await producer.send(
        b'{"total": 1}',
        group_id="g",
        headers={"X_REGION": "eu", "X-Tier": "gold"},
        content_type="application/json",
        traceparent=traceparent,
    )
    await producer.send(b"plain", group_id="g")
    await producer.close()
    # Then the first carries them in Kafka under HTTP produce's names, the second none
    with_headers, plain = await asyncio.to_thread(ingest_records, api, project, 2)
    headers = headers_of(with_headers)
    assert (headers["X_REGION"], headers["X-Tier"]) == (b"eu", b"gold")
    assert headers[H_CONTENT_TYPE] == b"application/json"
    assert headers[H_TRACEPARENT] == traceparent.encode()
    assert "X_REGION" not in headers_of(plain) and H_CONTENT_TYPE not in headers_of(plain)
    # And a header produce would refuse is refused here too, naming the message
    again = AsyncStreamProducer(address(api), key, project, "t", "eu-shop")
    await again.start()
    await again.send(b"x", group_id="g", headers={"X_GROUP_ID": "other"})
    with pytest.raises(StreamError) as caught:
        await again.flush()
    assert caught.value.code == "invalid_input"
    assert "X_GROUP_ID" in caught.value.message


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


async def test_a_key_for_some_topics_streams_to_them_and_is_refused_elsewhere_at_notify(
    api: Api, project: str
) -> None:
    # Given a key shaped like the README's "checkout" key: role producer, one topic
    key = await producer_key(api, project, topics=["t"])
    # Then it streams to its topic
    producer = AsyncStreamProducer(address(api), key, project, "t", "checkout")
    assert await producer.start() == 0
    for n in range(3):
        await producer.send(f"body-{n}".encode(), group_id="g")
    await producer.close()
    assert producer.durable == 3
    # And a NOTIFY for another topic is refused as forbidden, naming that topic
    elsewhere = AsyncStreamProducer(address(api), key, project, "other", "checkout")
    with pytest.raises(StreamError) as caught:
        await elsewhere.start()
    assert caught.value.code == "forbidden"
    assert "'other'" in str(caught.value)


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


async def test_frames_sent_with_hello_in_one_write_are_all_taken_in_order(
    api: Api, project: str
) -> None:
    # Given a producer that writes HELLO, NOTIFY, its messages and EOS at once, without waiting
    # for OK or NOTIFY_ACK (the listener reads them together, and NOTIFY must wait for Redis
    # while the messages behind it are already read)
    count = CREDITS - 1  # NOTIFY spends one credit too
    raw = await Raw.connect(api.app.state.stream.port, key=None)
    raw.send(
        frames.Hello(b"3", ADMIN_KEY.encode(), b"tests", b"raw"),
        frames.Notify(1, f"{project}/t/eager".encode(), 0),
        *[message(n, group=f"g{n % 3}") for n in range(count)],
        frames.EosMessage(1, count - 1),
    )
    # Then the stream opens at 0 and its last ACK says every message is durable
    assert isinstance(await raw.next(), frames.Ok)
    assert await raw.until(frames.NotifyAck) == frames.NotifyAck(True, 1, 0)
    while not any(a == (1, count) for f in raw.seen if isinstance(f, frames.Ack) for a in f.acks):
        await raw.until(frames.Ack)
    raw.close()
    # And Kafka holds each once, in order within each group
    found = await asyncio.to_thread(ingest_records, api, project, count)
    sequences = [int(headers_of(r)[H_SEQUENCE_ID]) for r in found]
    assert sorted(sequences) == list(range(count))
    for group in range(3):
        in_group = [n for n in sequences if n % 3 == group]
        assert in_group == sorted(in_group)


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


# An API that holds acknowledgements back for up to 2 s, with few credits.
SLOW_ACK_MS, SLOW_ACK_CREDITS = 2_000, 16


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def slow_acks(
    kafka_bootstrap: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Api]:
    async with running_api(
        tmp_path_factory.mktemp("slow-ack-api"),
        kafka_bootstrap=kafka_bootstrap,
        redis_url=redis_url,
        stream_port=0,
        stream_credits=SLOW_ACK_CREDITS,
        stream_ack_delay_ms=SLOW_ACK_MS,
    ) as running:
        yield running


async def test_reports_that_come_close_together_are_answered_in_one_ack(slow_acks: Api) -> None:
    project = await new_project(slow_acks)
    raw = await Raw.open(slow_acks)
    assert isinstance(await raw.next(), frames.Ok)
    raw.send(frames.Notify(1, f"{project}/t/together".encode(), 0))
    await raw.until(frames.NotifyAck)
    # One message acknowledged first: the Kafka client knows the topic from here on
    raw.send(message(0))
    while not (await raw.until(frames.Ack)).acks:
        pass
    # Six messages 10 ms apart: Kafka reports them in several rounds
    for n in range(1, 7):
        raw.send(message(n))
        await asyncio.sleep(0.01)
    point, answers = 1, 0
    while point < 7:
        ack = await raw.until(frames.Ack)
        if ack.acks:
            answers += 1
            point = max(p for _, p in ack.acks)
    # One ACK answers them (two if the first report came alone), not one per round
    assert point == 7
    assert answers <= 2, answers
    raw.send(frames.EosMessage(1, 6))
    raw.close()
    await drop_project(slow_acks.client, project)


async def test_a_producer_short_of_credits_is_answered_without_the_delay(slow_acks: Api) -> None:
    project = await new_project(slow_acks)
    producer = AsyncStreamProducer(address(slow_acks), ADMIN_KEY, project, "t", "short")
    await producer.start()

    async def send_all() -> None:
        for n in range(200):
            await producer.send(b"m", group_id=f"g{n % 5}")
        await producer.flush()

    # 200 messages on 16 credits: held 2 s per ACK, this would take 25 s
    await asyncio.wait_for(send_all(), 15)
    assert producer.durable == 200
    await producer.close()
    await drop_project(slow_acks.client, project)


async def test_every_open_session_keeps_its_streams_past_the_lease_ttl(
    kafka_bootstrap: str, redis_url: str, tmp_path: Path
) -> None:
    # Given an API whose leases last 1 s, renewed for every session by the replica's keeper
    async with running_api(
        tmp_path,
        kafka_bootstrap=kafka_bootstrap,
        redis_url=redis_url,
        stream_port=0,
        stream_lease_ms=1_000,
    ) as short:
        project = await new_project(short)
        producers = [
            AsyncStreamProducer(address(short), ADMIN_KEY, project, "t", f"kept-{n}")
            for n in range(3)
        ]
        for producer in producers:
            await producer.start()
        # When three sessions write for 3 s, and another session asks for their streams
        refused = 0
        for round_ in range(15):
            for n, producer in enumerate(producers):
                await producer.send(b"k", group_id=f"g{n}")
            if round_ % 3 == 2:
                raw = await Raw.open(short)
                assert isinstance(await raw.next(), frames.Ok)
                for n in range(3):
                    raw.send(frames.Notify(n + 1, f"{project}/t/kept-{n}".encode(), 0))
                for _ in range(3):
                    answer = await raw.until(frames.NotifyAck)
                    refused += not answer.success
                raw.close()
            await asyncio.sleep(0.2)
        # Then every ask was refused: each lease was renewed, and no producer lost its session
        assert refused == 15
        for producer in producers:
            await producer.flush()
            assert producer.durable == 15
            assert producer.reconnects == 0
            await producer.close()
        await drop_project(short.client, project)


async def test_the_blocking_producer_streams_too(api: Api, project: str) -> None:
    def stream() -> int:
        with StreamProducer(address(api), ADMIN_KEY, project, "t", "sync") as producer:
            for n in range(30):
                producer.send(b"s", group_id=f"g{n % 3}")
            producer.flush()
            return producer.durable

    assert await asyncio.to_thread(stream) == 30
    # Every acknowledged message is in Kafka, each once (named, should one be missing)
    found = await asyncio.to_thread(ingest_records, api, project, 30)
    ids = sorted(headers_of(record)[H_MESSAGE_ID].decode() for record in found)
    assert ids == sorted(f"sync:{n}" for n in range(30))
    assert await asyncio.to_thread(ingest_count, api, project) == 30


async def test_the_blocking_producer_sends_from_several_threads_without_waiting_for_its_own(
    api: Api, project: str
) -> None:
    def stream() -> tuple[bool, int]:
        with StreamProducer(address(api), ADMIN_KEY, project, "t", "threads") as producer:
            # Its loop's thread held up: sends return all the same (each has a credit)
            held, release = threading.Event(), threading.Event()

            def hold() -> None:
                held.set()
                release.wait(30)

            producer._loop.call_soon_threadsafe(hold)
            assert held.wait(10)
            first = threading.Thread(
                target=lambda: [producer.send(b"h", group_id="h") for _ in range(10)]
            )
            first.start()
            first.join(10)
            returned_while_held = not first.is_alive()
            release.set()
            first.join()
            # Four threads at once: every message numbered once, none lost
            senders = [
                threading.Thread(
                    target=lambda t=t: [producer.send(b"t", group_id=f"g{t}") for _ in range(100)]
                )
                for t in range(4)
            ]
            for sender in senders:
                sender.start()
            for sender in senders:
                sender.join()
            producer.flush()
            return returned_while_held, producer.durable

    returned_while_held, durable = await asyncio.to_thread(stream)
    assert returned_while_held
    assert durable == 410
    found = await asyncio.to_thread(ingest_records, api, project, 410)
    ids = sorted(headers_of(record)[H_MESSAGE_ID].decode() for record in found)
    assert ids == sorted(f"threads:{n}" for n in range(410))
    assert await asyncio.to_thread(ingest_count, api, project) == 410


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


# -- what one caller may hold ----------------------------------------------------------------


async def anonymous(port: int, sent: bytes) -> socket.socket:
    """A connection that sends ``sent`` (as much of it as the kernel takes at once) and never a
    whole HELLO. A bare socket: what it sends waits in the kernel, not in this process, which is
    the API's too."""
    sock = socket.socket()
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    with contextlib.suppress(BlockingIOError):
        sock.send(sent)
    return sock


async def answer(sock: socket.socket) -> list[frames.Frame]:
    """Every frame the server sends on ``sock`` until it closes the connection."""
    loop, cutter, received = asyncio.get_running_loop(), frames.FrameReader(), []
    with contextlib.suppress(ConnectionResetError):
        while data := await loop.sock_recv(sock, 65536):
            received.extend(cutter.feed(data))
    return received


def refusal_code(received: list[frames.Frame]) -> bytes:
    """The code of the one ERROR the server sent before it closed."""
    assert len(received) == 1 and isinstance(received[0], frames.Error), received
    return received[0].reason.split(b": ", 1)[0]


async def refused_sessions(api: Api) -> float:
    metrics = (await api.client.get("/metrics")).text
    for line in metrics.splitlines():
        if line.startswith('setu_api_stream_session_ends_total{how="refused"}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


@pytest.mark.finding("H1")
async def test_a_first_frame_longer_than_a_hello_is_refused_before_its_body_is_read(
    guarded: Api, guarded_project: str
) -> None:
    # Given 200 connections that each send the length of the largest frame and one byte short
    # of it, and never a HELLO (in groups smaller than the cap on connections without a session)
    server = guarded.app.state.stream
    limit = server.config.max_frame_bytes
    sent = limit.to_bytes(4, "big") + bytes(limit - 1)
    before = rss_kib()
    opened: list[socket.socket] = []
    try:
        for _ in range(200 // 8):
            group = [await anonymous(server.port, sent) for _ in range(8)]
            opened.extend(group)
            # Then each is refused from its length alone: ERROR, then the end
            for received in await asyncio.gather(*(answer(sock) for sock in group)):
                assert received == [
                    frames.Error(
                        b"protocol_error: the first frame (HELLO) may be at most "
                        + f"{HELLO_MAX_BYTES} bytes, not {limit}".encode()
                    )
                ]
        # And the listener holds nothing of them, and the process did not grow with them
        # (they offered 200 x 128 KiB)
        assert server.admission.pending == 0
        assert server.waiting_bytes == 0
        assert rss_kib() - before < 8 * 1024
        # While a producer, with them still open on its side, gets its session at once
        key = await producer_key(guarded, guarded_project)
        producer = AsyncStreamProducer(
            f"127.0.0.1:{server.port}", key, guarded_project, "t", "after-them"
        )
        assert await producer.start() == 0
        await producer.close()
    finally:
        for sock in opened:
            sock.close()


@pytest.mark.finding("H1", "M1")
async def test_connections_that_never_say_hello_neither_grow_the_listener_nor_lock_out_a_producer(
    guarded: Api, guarded_project: str
) -> None:
    # Given three times as many connections as may wait for a HELLO, each sending a HELLO's
    # largest length and one byte short of it, then nothing (and more than SESSIONS of them)
    server = guarded.app.state.stream
    sent = HELLO_MAX_BYTES.to_bytes(4, "big") + bytes(HELLO_MAX_BYTES - 1)
    socks = [await anonymous(server.port, sent) for _ in range(3 * PENDING)]
    answers = [asyncio.create_task(answer(sock)) for sock in socks]
    try:
        # When the listener has taken them all
        def turned_away() -> list[asyncio.Task[list[frames.Frame]]]:
            return [task for task in answers if task.done()]

        await wait_for_async(
            "all but the cap turned away, the rest read to their last byte",
            _true_when(
                lambda: (
                    len(turned_away()) == 2 * PENDING
                    and server.waiting_bytes == PENDING * (4 + HELLO_MAX_BYTES - 1)
                )
            ),
        )
        # Then only the cap waits, each holding at most a HELLO, and every other was closed
        # at once with a retryable ERROR
        assert server.admission.pending == PENDING
        for task in turned_away():
            assert refusal_code(task.result()) == b"dependency_unavailable"
        assert len(server.sessions) == 0
        # And a producer that says HELLO at once still gets a session, sends and is acknowledged,
        # while they are open: it turned away the connection that had waited longest
        key = await producer_key(guarded, guarded_project)
        producer = AsyncStreamProducer(
            f"127.0.0.1:{server.port}", key, guarded_project, "t", "legit"
        )
        assert await producer.start() == 0
        await producer.send(b"through", group_id="g")
        await producer.flush()
        assert producer.durable == 1
        assert len(server.sessions) == 1
        await wait_for_async(
            "one more turned away", _true_when(lambda: len(turned_away()) == 2 * PENDING + 1)
        )
        assert server.admission.pending == PENDING - 1
        await producer.close()
    finally:
        for task in answers:
            task.cancel()
        await asyncio.gather(*answers, return_exceptions=True)
        for sock in socks:
            sock.close()
    # And once they close, nothing of them is left
    await wait_for_async(
        "the listener free of them", _true_when(lambda: server.admission.pending == 0)
    )
    assert server.waiting_bytes == 0


@pytest.mark.finding("L6")
async def test_one_key_holds_at_most_its_share_of_sessions(
    guarded: Api, guarded_project: str
) -> None:
    # Given a producer key holding as many sessions as one key may
    key = await producer_key(guarded, guarded_project)
    held = [await Raw.open(guarded, key) for _ in range(PER_KEY)]
    for raw in held:
        assert isinstance(await raw.next(), frames.Ok)
    # When it opens one more
    extra = await Raw.open(guarded, key)
    refused = await extra.next()
    # Then that one gets a retryable ERROR and is closed
    assert isinstance(refused, frames.Error)
    assert (
        refused.reason
        == (
            f"rate_limited: this API key holds {PER_KEY} streaming sessions on this replica, the "
            "most one key may; end one or retry later"
        ).encode()
    )
    assert await extra.closed()
    # While another key still gets a session
    other = await Raw.open(guarded, await producer_key(guarded, guarded_project))
    assert isinstance(await other.next(), frames.Ok)
    # And once one of the key's sessions ends, the key may open one again
    held[0].close()
    server = guarded.app.state.stream
    await wait_for_async(
        "the closed session ended", _true_when(lambda: len(server.sessions) == PER_KEY)
    )
    again = await Raw.open(guarded, key)
    assert isinstance(await again.next(), frames.Ok)
    for raw in [*held[1:], other, again]:
        raw.close()
    await wait_for_async("the sessions ended", _true_when(lambda: len(server.sessions) == 0))


@pytest.mark.finding("L6")
async def test_one_session_holds_at_most_its_share_of_streams(
    guarded: Api, guarded_project: str
) -> None:
    # Given a session with as many streams open as one session may
    raw = await Raw.open(guarded)
    assert isinstance(await raw.next(), frames.Ok)
    for n in range(1, STREAMS + 1):
        raw.send(frames.Notify(n, f"{guarded_project}/t/s{n}".encode(), 0))
        assert await raw.until(frames.NotifyAck) == frames.NotifyAck(True, n, 0)
    # When one ends (EOS_MESSAGE, then its last ACK), another may open in its place
    raw.send(frames.EosMessage(1, 0))
    while not any(stream_id == 1 for stream_id, _ in (await raw.until(frames.Ack)).acks):
        pass
    raw.send(frames.Notify(STREAMS + 1, f"{guarded_project}/t/s{STREAMS + 1}".encode(), 0))
    assert await raw.until(frames.NotifyAck) == frames.NotifyAck(True, STREAMS + 1, 0)
    # But one more than the cap gets ERROR naming it, and the session ends
    raw.send(frames.Notify(99, f"{guarded_project}/t/s99".encode(), 0))
    refused = await raw.until(frames.Error)
    assert (
        refused.reason
        == (
            f"invalid_input: NOTIFY of stream 99: a session may have {STREAMS} streams open at "
            "most; end one (EOS_MESSAGE, then its last ACK) first"
        ).encode()
    )
    assert await raw.closed()


@pytest.mark.finding("L7")
async def test_refused_connections_are_counted_not_each_logged_as_a_warning(
    kafka_bootstrap: str, redis_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Given an API whose connections have 300 ms to say HELLO
    caplog.set_level(logging.DEBUG, logger="api.stream_server")
    async with running_api(
        tmp_path,
        kafka_bootstrap=kafka_bootstrap,
        redis_url=redis_url,
        stream_port=0,
        stream_hello_timeout_ms=300,
    ) as own:
        started = time.monotonic()
        # When 10 connections say nothing and 10 say HELLO with a wrong key
        silent = [await Raw.open(own, key=None) for _ in range(10)]
        wrong = [await Raw.open(own, key="setu_0000000000000000_nope") for _ in range(10)]
        # Then each is refused with ERROR, the silent ones once their time is up
        for raw in silent:
            assert await raw.next() == frames.Error(b"protocol_error: no HELLO in time")
            assert await raw.closed()
        for raw in wrong:
            refused = await raw.next()
            assert isinstance(refused, frames.Error)
            assert refused.reason.startswith(b"unauthorized: ")
            assert await raw.closed()
        # And all 20 are counted in the metric, each logged at DEBUG, and at most one WARNING
        # line per 10 s sums them up
        assert await refused_sessions(own) == 20
        records = [r for r in caplog.records if r.name == "api.stream_server"]
        assert (
            sum(r.levelno == logging.DEBUG and "refused" in r.getMessage() for r in records) == 20
        )
        warnings = [r for r in records if r.levelno >= logging.WARNING]
        assert 1 <= len(warnings) <= 1 + (time.monotonic() - started) // 10
