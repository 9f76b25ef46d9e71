"""One message's trace through the real pieces: the API (in process, real Kafka), the ingest
job (real Spark, which carries the trace context through) and a webhook call (real HTTP), its
spans read from the SDK's in-memory exporter (setu/tracing.py, docs/latency.md "Tracing")."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from delivery.http import HttpClient
from delivery.webhook import WebhookSender
from setu import tracing
from setu.envelope import Envelope
from setu.model import Endpoint, Subscription
from setu.outcome import Verdict
from tests.integration.api.support import drop_project, running_api
from tests.integration.spark.support import IngestWorld

# The producer's own trace: its span id becomes the parent of Setu's produce span.
USER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
USER_SPAN = "00f067aa0ba902b7"


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.use(tracing.Tracing.with_provider(provider))
    yield exporter
    tracing.use(tracing.Tracing.off())
    provider.shutdown()


class Webhook:
    """A local endpoint that answers 200 and keeps each call's headers."""

    def __init__(self) -> None:
        self.calls: list[dict[str, str]] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
        headers = {}
        for line in head.split("\r\n")[1:]:
            if ":" in line:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
        await reader.readexactly(int(headers.get("content-length", "0")))
        self.calls.append(headers)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
        await writer.drain()
        writer.close()


async def call_webhook(envelope: Envelope, project: str) -> tuple[Verdict, dict[str, str]]:
    webhook = Webhook()
    server = await asyncio.start_server(webhook.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    sub = Subscription(
        project=project, name="hook", topic="t", endpoint=Endpoint(f"http://127.0.0.1:{port}/")
    )
    async with server:
        outcome = await WebhookSender(sub, HttpClient(allow_private=True)).send(envelope, 1)
    return outcome.verdict, webhook.calls[0]


async def produce(world: IngestWorld, data_dir: Path, headers: dict[str, str]) -> int:
    async with running_api(
        data_dir, kafka_bootstrap=world.bootstrap, redis_url=world.redis_url
    ) as api:
        await api.client.post("/v1/projects", json={"name": world.project})
        topic = {"name": "t", "grouped": True, "partitions": 3}
        await api.client.post(f"/v1/projects/{world.project}/topics", json=topic)
        url = f"/v1/projects/{world.project}/topics/t/produce"
        status = (await api.client.post(url, content=b"{}", headers=headers)).status_code
        return status


def one(spans: list[ReadableSpan], name: str) -> ReadableSpan:
    found = [s for s in spans if s.name == name]
    assert len(found) == 1, [s.name for s in spans]
    return found[0]


def test_one_message_is_one_trace_from_the_producer_to_the_webhook(
    world: IngestWorld, spans: InMemorySpanExporter, tmp_path: Path
) -> None:
    # Given a producer that sends its own trace context with a message
    headers = {
        "X_MESSAGE_ID": "m1",
        "X_GROUP_ID": "g1",
        "traceparent": f"00-{USER_TRACE}-{USER_SPAN}-01",
    }
    try:
        # When the API takes it, the ingest job moves it to the main log, and a worker calls
        # the webhook with it
        assert asyncio.run(produce(world, tmp_path / "api", headers)) == 200
        log = world.main_log("t")
        with world.running_job(world.settings()):
            log.wait_for_ids({"m1"})
        envelope = log.records[0][2]
        verdict, call = asyncio.run(call_webhook(envelope, world.project))
    finally:
        asyncio.run(drop_api_project(world, tmp_path / "api"))
    # Then the produce span is a child of the producer's span
    finished = list(spans.get_finished_spans())
    produced = one(finished, "produce t")
    assert produced.kind is SpanKind.PRODUCER
    assert produced.context is not None and produced.parent is not None
    assert format(produced.context.trace_id, "032x") == USER_TRACE
    assert format(produced.parent.span_id, "016x") == USER_SPAN
    assert produced.attributes is not None
    assert produced.attributes["messaging.message.id"] == "m1"
    # And the message carried the produce span's context through both topics
    produce_context = f"00-{USER_TRACE}-{produced.context.span_id:016x}-01"
    assert envelope.traceparent == produce_context
    assert all(name != "traceparent" for name, _ in envelope.headers)
    # And the webhook call is a child of the produce span, and the webhook saw the call's own
    # span as its parent: the endpoint's spans join the producer's trace
    delivered = one(finished, "deliver hook")
    assert verdict is Verdict.DELIVERED
    assert delivered.kind is SpanKind.CLIENT
    assert delivered.parent is not None and delivered.parent.span_id == produced.context.span_id
    assert delivered.context is not None
    assert call["traceparent"] == f"00-{USER_TRACE}-{delivered.context.span_id:016x}-01"
    assert delivered.attributes is not None
    assert delivered.attributes["http.response.status_code"] == 200


async def drop_api_project(world: IngestWorld, data_dir: Path) -> None:
    async with running_api(
        data_dir, kafka_bootstrap=world.bootstrap, redis_url=world.redis_url
    ) as api:
        await drop_project(api.client, world.project)
