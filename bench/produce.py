"""Produce benchmark: single and batch produce through the HTTP API, against the limit of a
bare confluent-kafka producer on the same broker, in one run.

    python -m bench.produce [--bootstrap 127.0.0.1:9092] [--redis redis://127.0.0.1:6379/0]
                            [--duration 8] [--connections 64] [--rate 3000] [--batch-size 500]

It starts the API in a process of its own (uvicorn with uvloop and httptools, no access log,
a fresh SQLite store), creates a grouped 6-partition topic, and measures in turn:

1. single produce, closed loop with ``--connections`` clients: saturation throughput and its
   latency (with a closed loop, mean latency = clients / throughput, by Little's law);
2. single produce, open loop at ``--rate`` requests/s over the same clients: latency at the
   target load, counted from each request's scheduled time;
3. batch produce: messages/s with ``--batch-connections`` clients posting ``--batch-size``;
4. a bare producer (the API's librdkafka settings, the same keys, values and headers): the
   broker-side limit the batch path is compared with;
   (the batch's and the bare producer's records carry producer and sequence ids, as every
   streamed message does: the three paths write the same records)
5. the cost of authentication: single produce, closed loop, with a producer key against this
   API and without keys against a second API started with ``SETU_AUTH_ENABLED=false``,
   alternating on, off, on, off; the share auth keeps must be at least 0.9;
6. streaming produce (docs/streaming.md) with ``setu.client``, ``--streams`` streams at once:
   saturation throughput (from the first message after the warm-up to the last ACK), then
   open loop at half the bare producer's rate and at half its own saturated rate, with each
   message's latency from its scheduled send to the ACK that covered it;
7. the cost of tracing: the same, against a third API exporting a span per produce with OTLP
   to a local sink (``OTEL_EXPORTER_OTLP_ENDPOINT``), sampling ``--trace-sample`` of the
   requests (1.0: every one), and this one (tracing off); the share tracing keeps must be at
   least 0.9 (docs/latency.md, "Tracing").

Figures are printed and written as JSON under bench/results/. Targets (2-core machine):
single >= 3,000/s with p99 <= 20 ms, batch >= 50,000 messages/s, batch within 2x of bare,
auth and tracing each keep >= 0.9 of single-produce throughput, streaming >= 0.7 of bare with
p99 acknowledgement latency < 50 ms at half the bare rate.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import subprocess
import sys
import tempfile
import time
import uuid
from functools import partial
from pathlib import Path
from typing import Any

import orjson
import redis
from confluent_kafka import Producer

from api.producer import api_producer_config
from bench.http_load import Connection, closed_loop, open_loop, percentile, request_bytes
from bench.machine import (
    OtlpSink,
    quiet_client_logs,
    quiet_kafka_config,
    wait_for_own_server,
    write_result,
)
from bench.stream_load import stream_load
from cli.ports import free_ports, is_free
from cli.probes import http_ok
from setu.envelope import Envelope
from setu.names import ingest_topic
from state import keys
from state.sealing import Sealer

PARTITIONS = 6
GROUPS = 1000
# The bootstrap admin key of the APIs this benchmark starts.
ADMIN_KEY = secrets.token_urlsafe(32)
BODY = b'{"order": 12345, "items": [1, 2, 3], "note": "' + b"x" * 180 + b'"}'


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class CpuMeter:
    """CPU spent by the API process and by this client during one phase; on a shared machine
    these per-request costs say more than throughput, which depends on what else runs."""

    def __init__(self, api_pid: int) -> None:
        self.api_pid = api_pid
        self.api = cpu_seconds(api_pid)
        self.client = time.process_time()
        self.load = os.getloadavg()[0]

    def per(self, units: int, unit: str) -> dict[str, float]:
        api = cpu_seconds(self.api_pid) - self.api
        client = time.process_time() - self.client
        return {
            f"api_cpu_us_per_{unit}": round(1e6 * api / units, 1) if units else 0.0,
            f"client_cpu_us_per_{unit}": round(1e6 * client / units, 1) if units else 0.0,
            "load_average_1m": round(max(self.load, os.getloadavg()[0]), 2),
        }


def serve(port: int) -> None:
    """Runs the API in this process (the benchmark starts it as a child)."""
    import uvicorn

    from api.app import create_app
    from api.server import uvicorn_options
    from setu import tracing
    from setu.settings import Settings
    from state import migrate

    settings = Settings()
    migrate.upgrade(settings.resolved_database_url())
    tracing.configure("setu-api")  # on when the benchmark set OTEL_EXPORTER_OTLP_ENDPOINT
    uvicorn.run(
        create_app(settings),
        host="127.0.0.1",
        port=port,
        loop="uvloop",
        **uvicorn_options(settings.http_head_timeout_ms),
        access_log=False,
        log_level="warning",
    )


def start_api(
    args: argparse.Namespace,
    data_dir: str,
    port: int,
    *,
    auth: bool = True,
    extra_env: dict[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("OTEL_")},
        **(extra_env or {}),
        "SETU_DATA_DIR": data_dir,
        "SETU_KAFKA_BOOTSTRAP": args.bootstrap,
        "SETU_REDIS_URL": args.redis,
        "SETU_ADMIN_KEY": ADMIN_KEY,
        "SETU_SECRET_KEY": Sealer.new_key(),
        "SETU_AUTH_ENABLED": "true" if auth else "false",
        # The API's own throughput is measured, not the default byte quota (bench/burst.py).
        "SETU_PRODUCE_QUOTA_BYTES_PER_SECOND": "0",
    }
    env.pop("SETU_DATABASE_URL", None)
    if not (extra_env and "SETU_STREAM_PORT" in extra_env):
        env.pop("SETU_STREAM_PORT", None)
    command = [sys.executable, "-m", "bench.produce", "--serve", "--port", str(port)]
    process = subprocess.Popen(command, env=env)
    health = f"http://127.0.0.1:{port}/v1/health"
    wait_for_own_server(process, f"the API on port {port}", lambda: http_ok(health), 30)
    return process


async def call(port: int, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    conn = await Connection.open("127.0.0.1", port)
    try:
        payload = b"" if body is None else orjson.dumps(body)
        headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        status, raw = await conn.send(request_bytes(method, path, headers, payload))
        return status, orjson.loads(raw) if raw else None
    finally:
        conn.close()


def single_request(path: str, key: str | None) -> Any:
    auth = {"Authorization": f"Bearer {key}"} if key else {}

    def make(index: int, n: int) -> bytes:
        headers = {
            **auth,
            "Content-Type": "application/octet-stream",
            "X-Message-Id": f"c{index}-{n}",
            "X-Group-Id": f"g{(index * 7919 + n) % GROUPS}",
        }
        return request_bytes("POST", path, headers, BODY)

    return make


def batch_request(path: str, size: int, key: str) -> Any:
    """Each client a producer of its own, its messages numbered: the records carry what a
    streamed message's carry (message, group, producer and sequence ids; docs/streaming.md),
    so the two paths are compared on the same records."""
    text = BODY.decode()
    auth = {"Authorization": f"Bearer {key}"}
    run = uuid.uuid4().hex[:6]

    def make(index: int, n: int) -> bytes:
        messages = [
            {
                "message_id": f"b{index}-{n}-{i}",
                "group_id": f"g{(n * size + i) % GROUPS}",
                "producer_id": f"bench-{run}-{index}",
                "sequence_id": n * size + i,
                "body": text,
            }
            for i in range(size)
        ]
        headers = {**auth, "Content-Type": "application/json"}
        return request_bytes("POST", path, headers, orjson.dumps({"messages": messages}))

    return make


def bare_producer(bootstrap: str, topic: str, count: int) -> dict[str, Any]:
    """The same records as the API writes, from one producer at full speed, until all acked."""
    config = api_producer_config(bootstrap, ack_timeout_ms=30_000, max_message_bytes=1 << 20)
    producer = Producer({**config, **quiet_kafka_config()})
    records = []
    for i in range(GROUPS):
        env = Envelope(
            f"bare-{i}",
            BODY,
            group_id=f"g{i}",
            producer_id="bench-bare",
            sequence_id=i,
            produced_at_ms=int(time.time() * 1000),
        )
        records.append((env.key, env.kafka_headers()))
    acked = failed = 0

    def on_delivery(error: Any, _: Any) -> None:
        nonlocal acked, failed
        if error is None:
            acked += 1
        else:
            failed += 1

    producer.produce(topic, BODY, b"warm", on_delivery=on_delivery)
    producer.flush(10)
    acked = 0
    started = time.perf_counter()
    for i in range(count):
        key, headers = records[i % GROUPS]
        while True:
            try:
                producer.produce(topic, BODY, key, headers=headers, on_delivery=on_delivery)  # type: ignore[arg-type]
                break
            except BufferError:
                producer.poll(0.001)
        if i % 1000 == 0:
            producer.poll(0)
    producer.flush(60)
    seconds = time.perf_counter() - started
    return {
        "messages": count,
        "acked": acked,
        "failed": failed,
        "seconds": round(seconds, 3),
        "messages_per_s": round(acked / seconds, 1),
    }


def bare_paced(bootstrap: str, topic: str, rate: float, seconds: float) -> dict[str, Any]:
    """The floor at a low rate: a bare producer in a process of its own sends the same records
    at ``rate`` msg/s for ``seconds``, polling for its reports between sends as an
    application would. Its CPU per message (all its threads) and its ack latency."""
    command = [
        sys.executable,
        "-m",
        "bench.produce",
        "--bare-paced",
        topic,
        "--bootstrap",
        bootstrap,
        "--stream-rate",
        str(rate),
        "--duration",
        str(seconds),
    ]
    done = subprocess.run(command, capture_output=True, check=True, timeout=seconds + 120)
    return dict(orjson.loads(done.stdout.splitlines()[-1]))


def run_bare_paced(bootstrap: str, topic: str, rate: float, seconds: float) -> dict[str, Any]:
    config = api_producer_config(bootstrap, ack_timeout_ms=30_000, max_message_bytes=1 << 20)
    producer = Producer({**config, **quiet_kafka_config()})
    env = Envelope(
        "bare-paced",
        BODY,
        group_id="g0",
        producer_id="bench-bare",
        sequence_id=0,
        produced_at_ms=int(time.time() * 1000),
    )
    latencies: list[float] = []

    def on_delivery(error: Any, _: Any, sent: float) -> None:
        if error is None:
            latencies.append(time.perf_counter() - sent)

    producer.produce(topic, BODY, b"warm")
    producer.flush(10)
    began_cpu = time.process_time()
    began = time.perf_counter()
    interval, sent = 1.0 / rate, 0
    while (now := time.perf_counter()) < began + seconds:
        due = began + sent * interval
        if due > now:
            # (poll's timeout is whole milliseconds: a shorter one would spin)
            time.sleep(due - now)
            producer.poll(0)
            continue
        producer.produce(
            topic,
            BODY,
            env.key,
            headers=env.kafka_headers(),  # type: ignore[arg-type]
            on_delivery=partial(on_delivery, sent=due),
        )
        sent += 1
    producer.flush(60)
    cpu = time.process_time() - began_cpu
    ordered = sorted(latencies)
    return {
        "offered_per_s": rate,
        "sent": sent,
        "acked": len(latencies),
        "cpu_us_per_message": round(1e6 * cpu / max(sent, 1), 1),
        "p50_ms": round(percentile(ordered, 0.5) * 1000, 2) if ordered else None,
        "p99_ms": round(percentile(ordered, 0.99) * 1000, 2) if ordered else None,
    }


async def set_up(port: int) -> tuple[str, str]:
    """A project with a grouped topic ``orders``, and a producer key of the project."""
    project = f"bench{uuid.uuid4().hex[:8]}"
    await call(port, "POST", "/v1/projects", {"name": project})
    status, _ = await call(
        port,
        "POST",
        f"/v1/projects/{project}/topics",
        {"name": "orders", "grouped": True, "partitions": PARTITIONS, "retention_hours": 1},
    )
    assert status == 201, status
    status, key = await call(
        port, "POST", f"/v1/projects/{project}/keys", {"name": "bench", "role": "producer"}
    )
    assert status == 201, status
    return project, str(key["key"])


async def alternating(
    args: argparse.Namespace, apis: dict[str, tuple[int, bool]], what: str
) -> dict[str, Any]:
    """Single produce, closed loop, against each API in turn, twice: ``apis`` maps a label to
    (port, whether to send a producer key). Returns each label's mean rate and the first's
    share of the second's."""
    phases: dict[str, list[float]] = {label: [] for label in apis}
    made = {label: (port, key, await set_up(port)) for label, (port, key) in apis.items()}
    for _ in range(2):
        for label, (port, send_key, (project, key)) in made.items():
            print(f"single produce, closed loop, {what} {label} ...", flush=True)
            result = await closed_loop(
                "127.0.0.1",
                port,
                single_request(
                    f"/v1/projects/{project}/topics/orders/produce", key if send_key else None
                ),
                connections=args.connections,
                duration_s=args.duration / 2,
                warmup_s=1,
            )
            assert set(result.statuses) == {200}, result.statuses
            phases[label].append(result.achieved_per_s)
    for port, _, (project, _) in made.values():
        await call(port, "DELETE", f"/v1/projects/{project}/topics/orders")
        await call(port, "DELETE", f"/v1/projects/{project}")
    on, off = (sum(phases[label]) / 2 for label in apis)
    return {
        f"{what}_on_per_s": round(on, 1),
        f"{what}_off_per_s": round(off, 1),
        "runs": phases,
        "share_kept": round(on / off, 3) if off else 0.0,
    }


async def auth_cost(args: argparse.Namespace, on_port: int, off_port: int) -> dict[str, Any]:
    """With a producer key against the API with auth, and with no key against the one
    without (see the module doc)."""
    return await alternating(args, {"on": (on_port, True), "off": (off_port, False)}, "auth")


async def tracing_cost(
    args: argparse.Namespace, on_port: int, off_port: int, sink: OtlpSink
) -> dict[str, Any]:
    """The API exporting a span per produce to a local OTLP sink against the API without
    tracing (docs/latency.md, "Tracing"), both with auth."""
    result = await alternating(args, {"on": (on_port, True), "off": (off_port, True)}, "tracing")
    # The SDK's batch processor exports every 5 s.
    if not await asyncio.to_thread(sink.received.wait, 15):
        raise SystemExit("the traced API exported no span: tracing was not on")
    result["exported_bytes"] = sink.bytes
    return result


async def measure(args: argparse.Namespace, api_pid: int) -> dict[str, Any]:
    port = args.port
    project, key = await set_up(port)
    base = f"/v1/projects/{project}/topics/orders"
    host = "127.0.0.1"
    figures: dict[str, Any] = {}
    try:
        if not args.only_streaming:
            figures.update(await single_phases(args, api_pid, host, base, key))
        print(
            f"batch produce, {args.batch_connections} clients x {args.batch_size} messages ...",
            flush=True,
        )
        meter = CpuMeter(api_pid)
        batches = await closed_loop(
            host,
            port,
            batch_request(base + "/produce/batch", args.batch_size, key),
            connections=args.batch_connections,
            duration_s=args.duration,
            warmup_s=2,
        )
        batch_cpu = meter.per(batches.sent * args.batch_size, "message")
        ok_share = batches.ok / batches.completed if batches.completed else 0.0
        figures["batch"] = {
            "batch_size": args.batch_size,
            "connections": args.batch_connections,
            **batches.summary(),
            "messages_per_s": round(batches.achieved_per_s * ok_share * args.batch_size, 1),
            **batch_cpu,
        }
        print("bare confluent-kafka producer ...", flush=True)
        topic = ingest_topic(project, "orders")
        bare = await asyncio.to_thread(
            bare_producer, args.bootstrap, topic, max(batches.ok * args.batch_size, 200_000)
        )
        figures["bare_producer"] = bare
        print(f"bare producer, {args.stream_rate:.0f} msg/s ...", flush=True)
        figures["bare_paced"] = await asyncio.to_thread(
            bare_paced, args.bootstrap, topic, args.stream_rate, args.duration
        )
        figures.update(await stream_phases(args, api_pid, project, key, bare))
    finally:
        await call(port, "DELETE", base)
        await call(port, "DELETE", f"/v1/projects/{project}")
    return figures


async def single_phases(
    args: argparse.Namespace, api_pid: int, host: str, base: str, key: str
) -> dict[str, Any]:
    """Single produce: saturated (closed loop), then open loop at ``--rate``."""
    print(f"single produce, closed loop, {args.connections} clients ...", flush=True)
    meter = CpuMeter(api_pid)
    saturated = await closed_loop(
        host,
        args.port,
        single_request(base + "/produce", key),
        connections=args.connections,
        duration_s=args.duration,
        warmup_s=2,
    )
    saturated_cpu = meter.per(saturated.sent, "request")
    print(
        f"single produce, open loop at {args.rate}/s over {args.connections} clients ...",
        flush=True,
    )
    meter = CpuMeter(api_pid)
    paced = await open_loop(
        host,
        args.port,
        single_request(base + "/produce", key),
        rate_per_s=args.rate,
        connections=args.connections,
        duration_s=args.duration,
        warmup_s=2,
    )
    return {
        "single_closed_loop": {**saturated.summary(), **saturated_cpu},
        "single_open_loop": {
            "offered_per_s": args.rate,
            **paced.summary(),
            **meter.per(paced.sent, "request"),
        },
    }


async def stream_phases(
    args: argparse.Namespace, api_pid: int, project: str, key: str, bare: dict[str, Any]
) -> dict[str, Any]:
    """Streaming produce: saturated, then open loop at ``--stream-rate`` (a low rate, where
    each message's own wake-ups and frames are its cost), at half the bare producer's rate
    and at half streaming's own saturated rate."""
    stream_phase = partial(
        stream_load,
        f"127.0.0.1:{args.stream_port}",
        key,
        project,
        "orders",
        BODY,
        GROUPS,
        streams=args.streams,
        duration_s=args.duration,
    )
    print(f"streaming produce, {args.streams} streams, saturated ...", flush=True)
    meter = CpuMeter(api_pid)
    streamed = await stream_phase()
    figures: dict[str, Any] = {
        "stream": {
            "streams": args.streams,
            **streamed.summary(),
            **meter.per(streamed.sent_in_all, "message"),
        }
    }
    for name, rate in (
        ("stream_low_rate", args.stream_rate),
        ("stream_paced", bare["messages_per_s"] / 2),
        ("stream_paced_own", streamed.summary()["messages_per_s"] / 2),
    ):
        print(f"streaming produce, {args.streams} streams, {rate:.0f} msg/s ...", flush=True)
        meter = CpuMeter(api_pid)
        run = await stream_phase(rate_per_s=rate)
        figures[name] = {
            "streams": args.streams,
            "offered_per_s": round(rate, 1),
            **run.summary(),
            **meter.per(run.sent_in_all, "message"),
        }
    return figures


def verdicts(figures: dict[str, Any]) -> dict[str, bool]:
    batch_rate = figures["batch"]["messages_per_s"]
    bare_rate = figures["bare_producer"]["messages_per_s"]
    low = figures["stream_low_rate"]
    checks = {
        "batch_at_least_50000_per_s": batch_rate >= 50_000,
        "batch_within_2x_of_bare": bare_rate <= 2 * batch_rate,
        "stream_at_least_0.7_of_bare": figures["stream"]["messages_per_s"] >= 0.7 * bare_rate,
        "stream_at_least_1.2x_batch": figures["stream"]["messages_per_s"] >= 1.2 * batch_rate,
        "stream_p99_ack_under_50ms_at_half_bare": figures["stream_paced"].get("p99_ms", 1e9) < 50,
        "stream_low_rate_api_cpu_at_most_60us": low["api_cpu_us_per_message"] <= 60,
        "stream_low_rate_p99_ack_at_most_20ms": low.get("p99_ms", 1e9) <= 20,
    }
    if "single_closed_loop" in figures:
        checks["single_at_least_3000_per_s"] = (
            figures["single_closed_loop"]["requests_per_s"] >= 3000
        )
        checks["single_p99_at_most_20ms_at_target_rate"] = (
            figures["single_open_loop"]["p99_ms"] <= 20
        )
    if "auth" in figures:
        checks["auth_keeps_at_least_0.9"] = figures["auth"]["share_kept"] >= 0.9
        checks["tracing_keeps_at_least_0.9"] = figures["tracing"]["share_kept"] >= 0.9
    return checks


def report(figures: dict[str, Any], checks: dict[str, bool]) -> None:
    batch, bare = figures["batch"], figures["bare_producer"]
    print()
    if "single_closed_loop" in figures:
        single, paced = figures["single_closed_loop"], figures["single_open_loop"]
        print(
            f"single, closed loop : {single['requests_per_s']:>9.0f} req/s   "
            f"p50 {single['p50_ms']} ms  p99 {single['p99_ms']} ms  statuses {single['statuses']}"
        )
        print(
            f"single, {paced['offered_per_s']}/s paced: {paced['requests_per_s']:>8.0f} req/s   "
            f"p50 {paced['p50_ms']} ms  p99 {paced['p99_ms']} ms  statuses {paced['statuses']}"
        )
        print(f"API CPU, single     : {single['api_cpu_us_per_request']} us/request")
    print(
        f"batch of {batch['batch_size']:<5}     : {batch['messages_per_s']:>9.0f} msg/s   "
        f"p50 {batch['p50_ms']} ms  p99 {batch['p99_ms']} ms a batch  {batch['statuses']}  "
        f"API {batch['api_cpu_us_per_message']} us/message"
    )
    print(f"bare producer       : {bare['messages_per_s']:>9.0f} msg/s   ({bare['messages']} msgs)")
    ratio = bare["messages_per_s"] / batch["messages_per_s"] if batch["messages_per_s"] else 0
    print(f"bare / batch        : {ratio:.2f}x")
    streamed = figures["stream"]
    share = streamed["messages_per_s"] / bare["messages_per_s"] if bare["messages_per_s"] else 0
    over_batch = (
        streamed["messages_per_s"] / batch["messages_per_s"] if batch["messages_per_s"] else 0
    )
    print(
        f"stream, saturated   : {streamed['messages_per_s']:>9.0f} msg/s   "
        f"({share:.2f} of bare, {over_batch:.2f}x batch, {streamed['streams']} streams, "
        f"API {streamed['api_cpu_us_per_message']} us/message)"
    )
    floor = figures["bare_paced"]
    print(
        f"bare, {floor['offered_per_s']:.0f}/s paced  : CPU {floor['cpu_us_per_message']} "
        f"us/message, ack p50 {floor['p50_ms']} ms  p99 {floor['p99_ms']} ms"
    )
    for name in ("stream_low_rate", "stream_paced", "stream_paced_own"):
        paced_stream = figures[name]
        print(
            f"stream, {paced_stream['offered_per_s']:.0f}/s paced: "
            f"{paced_stream['messages_per_s']:>6.0f} msg/s   ack p50 {paced_stream.get('p50_ms')} "
            f"ms  p99 {paced_stream.get('p99_ms')} ms  max {paced_stream.get('max_ms')} ms  "
            f"API {paced_stream['api_cpu_us_per_message']} us/message, "
            f"client {paced_stream['client_cpu_us_per_message']} us/message"
        )
    if "auth" in figures:
        auth = figures["auth"]
        print(
            f"auth on / off       : {auth['auth_on_per_s']:.0f} / {auth['auth_off_per_s']:.0f} "
            f"req/s single, share kept {auth['share_kept']}"
        )
        traced = figures["tracing"]
        print(
            f"tracing on / off    : {traced['tracing_on_per_s']:.0f} / "
            f"{traced['tracing_off_per_s']:.0f} req/s single, share kept {traced['share_kept']} "
            f"({traced['exported_bytes']} bytes of spans exported)"
        )
    for name, passed in checks.items():
        print(f"  {'PASS' if passed else 'MISS'}  {name}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--bootstrap", default=os.environ.get("SETU_KAFKA_BOOTSTRAP", "127.0.0.1:9092")
    )
    parser.add_argument(
        "--redis", default=os.environ.get("SETU_REDIS_URL", "redis://127.0.0.1:6379/0")
    )
    parser.add_argument(
        "--port", type=int, default=0, help="the API's port (default: a free one, and the next)"
    )
    parser.add_argument("--duration", type=float, default=8.0, help="seconds measured per phase")
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--rate", type=float, default=3000.0, help="paced single-produce rate")
    parser.add_argument("--batch-size", type=int, default=500)
    parser.add_argument("--batch-connections", type=int, default=4)
    parser.add_argument("--streams", type=int, default=4, help="streams at once (streaming)")
    parser.add_argument(
        "--stream-rate",
        type=float,
        default=2000.0,
        help="the low streaming rate measured, msg/s over all streams (and the bare floor's)",
    )
    parser.add_argument(
        "--only-streaming",
        action="store_true",
        help="batch, bare and streaming phases only (no single produce, auth or tracing)",
    )
    parser.add_argument("--bare-paced", metavar="TOPIC", help=argparse.SUPPRESS)
    parser.add_argument(
        "--trace-sample",
        type=float,
        default=1.0,
        help="the share of produce requests the traced API samples (OTEL_TRACES_SAMPLER_ARG)",
    )
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        serve(args.port)
        return 0
    if args.bare_paced:
        paced = run_bare_paced(args.bootstrap, args.bare_paced, args.stream_rate, args.duration)
        print(orjson.dumps(paced).decode())
        return 0
    import uvloop

    quiet_client_logs()
    with (
        tempfile.TemporaryDirectory(prefix="setu-bench-") as data_dir,
        tempfile.TemporaryDirectory(prefix="setu-bench-") as open_dir,
        tempfile.TemporaryDirectory(prefix="setu-bench-") as traced_dir,
    ):
        ports = [args.port + n for n in range(4)] if args.port else free_ports(4)
        taken = [p for p in ports if not is_free(p)]
        if taken:
            raise SystemExit(f"ports {taken} are taken: choose another --port")
        args.port, open_port, traced_port, args.stream_port = ports
        # No ingest job runs here. On a fresh stack with no marks in Kafka it would publish
        # none and set this marker; without it streaming NOTIFY is refused (docs/ingest.md).
        redis_client = redis.Redis.from_url(args.redis)
        redis_client.set(keys.producer_marks_loaded(), "1")
        redis_client.close()
        sink = OtlpSink()
        api = start_api(
            args, data_dir, args.port, extra_env={"SETU_STREAM_PORT": str(args.stream_port)}
        )
        others: list[subprocess.Popen[bytes]] = []
        try:
            if not args.only_streaming:
                others.append(start_api(args, open_dir, open_port, auth=False))
                sampling = {
                    "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
                    "OTEL_TRACES_SAMPLER_ARG": str(args.trace_sample),
                }
                env = {**sink.env(), **sampling}
                others.append(start_api(args, traced_dir, traced_port, extra_env=env))
            figures = uvloop.run(measure(args, api.pid))
            if not args.only_streaming:
                figures["auth"] = uvloop.run(auth_cost(args, args.port, open_port))
                figures["tracing"] = uvloop.run(tracing_cost(args, traced_port, args.port, sink))
        finally:
            for process in (api, *others):
                process.terminate()
                process.wait(15)
            sink.close()
    checks = verdicts(figures)
    report(figures, checks)
    document = {
        "benchmark": "produce",
        "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "settings": {k: v for k, v in vars(args).items() if k != "serve"},
        "figures": figures,
        "targets": checks,
    }
    out = write_result("produce", document)
    print(f"\nwritten {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
