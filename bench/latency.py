"""End-to-end latency: from a producer's POST to the webhook call, on the real stack.

    python -m bench.latency [--bootstrap 127.0.0.1:9092] [--redis redis://127.0.0.1:6379/0]
                            [--phases 50,200,1000,200dup] [--seconds 60] [--warmup 15]
                            [--modes micro-batch,real-time]

The stack is Setu's own processes as deployed (``setu api``, ``setu ingest`` in its default
mode, one ``setu deliver``) on free ports, with a data folder and Spark checkpoint of
its own, reading only this run's project; the webhook is a process of its own (uvloop) that
answers 200 at once and timestamps each call. Kafka and Redis are the ones given.

One grouped topic of 6 partitions, one grouped subscription, 1,000 groups. Each phase sends an
open-loop load (every message at its scheduled time, on as many keep-alive connections as it
takes up to ``MAX_CONNECTIONS``, past which a message waits for one; a stall is never hidden:
latency counts from the schedule) for ``--warmup`` plus
``--seconds``; only messages scheduled after the warm-up are measured. ``200dup`` is 200 msg/s
with 10 % of the messages carrying a producer id and sequence, half of those sent twice (a
producer's retry): the de-duplication path, which must still call the webhook once.

Per message, from clocks of this one machine:

- ``end_to_end``: scheduled POST -> webhook call arrives;
- ``produce_ack``: scheduled POST -> 2xx answer;
- ``to_ingest_topic``: scheduled POST -> the ingest record's timestamp (the API's produce);
- ``ingest``: ingest record -> main-log record;
- ``delivery``: main-log record -> webhook call (waiting for the worker, dispatch, the call).

The finer split comes from the services' own histograms, read before and after each phase
(quantiles interpolated within buckets, as Prometheus's ``histogram_quantile``):
``setu_ingest_batch_seconds`` (a real-time batch: the checkpoint interval),
``setu_delivery_ingest_seconds`` (produce -> main-log record), ``setu_delivery_main_wait_seconds``
(main-log record -> read by the worker), ``setu_delivery_dispatch_seconds`` (read -> call sent)
and ``setu_delivery_call_duration_seconds``; a service without one reports it as missing.

Each phase also reports how many cores each process (with its children) kept busy. After the
phases a topic is created and a message produced to it every 0.2 s until one is delivered: how
soon a new topic's first message arrives, counted from the topic's creation.

``--api URL --api-key KEY --bootstrap KAFKA`` measures a stack that already runs instead, such
as ``setu dev up``'s with the URL, key and Kafka it printed: from outside, as a user would
(its processes' cores are found by their command lines; its metrics on the ports ``dev up``
prints, ``--ingest-metrics-port`` / ``--worker-metrics-port``).

``--modes micro-batch,real-time`` measures the stack once per ingest mode (``SETU_INGEST_MODE``,
docs/ingest.md), one after the other in the same run, and writes them side by side.

Targets (docs/latency.md; 2-core machine, everything on it): end to end p95 <= 100 ms and
p99 <= 400 ms at 200 msg/s, p99 <= 500 ms at 1,000 msg/s; the ingest job's cores <= 0.4 at
200 msg/s; a new topic's first message delivered within 10 s of its creation.
Figures are printed and written as JSON under bench/results/.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import orjson
from confluent_kafka import Consumer, TopicPartition

from bench.crash.stack import base_env
from bench.http_load import Connection, percentile, request_bytes
from bench.machine import (
    process_tree,
    quiet_client_logs,
    quiet_kafka_config,
    service_arguments,
    wait_for_own_server,
    write_result,
)
from cli.ports import any_free_port
from cli.probes import http_ok
from setu import names
from setu.envelope import H_MESSAGE_ID
from spark.job import project_pattern
from state.sealing import Sealer

REPO_ROOT = Path(__file__).resolve().parents[1]
GROUPS = 1_000
PARTITIONS = 6
PRODUCERS = 7
BODY = b'{"order": 12345, "items": [1, 2, 3], "note": "' + b"x" * 180 + b'"}'
# Connections idle longer are not used again: the API closes idle keep-alive connections
# after 5 s (uvicorn's default), and a request sent as it closes gets no answer.
KEEP_ALIVE_S = 2.0
# Connections open at once, at most: a stall of the stack at 1,000 msg/s otherwise opened one
# per waiting message (20,000, past the load's file descriptors; the run then measured the
# load generator's failures). Messages beyond it wait for a connection, counted from their
# schedule as always.
MAX_CONNECTIONS = 256
# End to end, per phase: (quantile, ms). And the ingest job's cores at 200 msg/s, a new topic's
# first delivery (docs/latency.md).
TARGETS = {"200": [("p95", 100.0), ("p99", 400.0)], "1000": [("p99", 500.0)]}
INGEST_CORES_AT_200 = 0.4
# The width of a window of the load, by scheduled time, in the report of where the tail was.
WINDOW_S = 5
NEW_TOPIC_S = 10.0
# The services' histograms of the finer split: (name, stage).
HISTOGRAMS = {
    "ingest": [("setu_ingest_batch_seconds", "ingest_batch")],
    "deliver": [
        ("setu_delivery_ingest_seconds", "ingest_at_worker"),
        ("setu_delivery_main_wait_seconds", "main_wait"),
        ("setu_delivery_dispatch_seconds", "dispatch"),
        ("setu_delivery_call_duration_seconds", "webhook_call"),
        ("setu_delivery_end_to_end_seconds", "end_to_end_at_worker"),
    ],
}


# The webhook: a process of its own that answers at once and timestamps every call; a path
# under /fail/ answers 503, one under /hang/ never answers (bench.fanout's failing endpoints).


EMPTY = b"content-length: 0\r\n\r\n"


def _line_end(head: bytes, start: int) -> int:
    """Where the header line at ``start`` ends (the head's last line has no CRLF)."""
    end = head.find(b"\r\n", start)
    return len(head) if end < 0 else end


class _Webhook(asyncio.Protocol):
    arrivals: dict[bytes, list[float]] = {}
    answered = [0]  # messages that reached an endpoint answering 200 (GET /count)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: Any = transport
        self.buffer = b""

    def data_received(self, data: bytes) -> None:
        now = time.time()
        self.buffer += data
        while (end := self.buffer.find(b"\r\n\r\n")) >= 0:
            head = self.buffer[:end]
            lower = head.lower()
            length = 0
            at = lower.find(b"content-length: ")
            if at >= 0:
                length = int(head[at + 16 : _line_end(head, at)])
            if len(self.buffer) < end + 4 + length:
                return
            self.buffer = self.buffer[end + 4 + length :]
            if head.startswith(b"GET /"):
                self._report(head)
                continue
            at = lower.find(b"\r\nx_message_id: ")
            if at >= 0:
                message = head[at + 16 : _line_end(head, at + 2)]
                target = head.split(b" ", 2)[1]
                if target != b"/hook":
                    # Another endpoint (bench.fanout's one per subscription): by both.
                    message = target + b"#" + message
                failing = target.startswith((b"/hang/", b"/fail/"))
                seen = self.arrivals.get(message)
                if seen is None:
                    self.arrivals[message] = [now, 1]
                    self.answered[0] += not failing
                else:
                    seen[1] += 1
                if target.startswith(b"/hang/"):
                    continue  # an endpoint that never answers: the caller's timeout ends it
                if target.startswith(b"/fail/"):
                    self.transport.write(b"HTTP/1.1 503 Service Unavailable\r\n%s" % EMPTY)
                    continue
            self.transport.write(b"HTTP/1.1 200 OK\r\n%s" % EMPTY)

    def _report(self, head: bytes) -> None:
        if head.startswith(b"GET /count"):
            body = b"%d" % self.answered[0]
        else:  # GET /dump
            body = orjson.dumps({k.decode(): v for k, v in self.arrivals.items()})
        self.transport.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))


def serve_webhook(port: int) -> None:
    import uvloop

    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(_Webhook, "127.0.0.1", port)
        await server.serve_forever()

    uvloop.run(main())


def webhook_get(port: int, what: str) -> bytes:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/{what}", timeout=60) as response:
        body: bytes = response.read()
        return body


# The stack.


@dataclass
class Stack:
    workdir: Path
    bootstrap: str
    redis: str
    project: str
    api_port: int = field(default_factory=any_free_port)
    webhook_port: int = field(default_factory=any_free_port)
    ingest_metrics_port: int = field(default_factory=any_free_port)
    deliver_metrics_port: int = field(default_factory=any_free_port)
    admin_key: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    # Delivery workers besides the first (``deliver-2``, ...), each with a metrics port.
    more_workers: int = 0
    extra_env: dict[str, str] = field(default_factory=dict)
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def shared_log(self) -> str | None:
        """This run's own shared ingest log, when it runs with ``SETU_INGEST_LOG=shared``."""
        if self.extra_env.get("SETU_INGEST_LOG") != "shared":
            return None
        return f"{names.SHARED_INGEST_LOG}-{self.project}"

    def ingest_pattern(self) -> str:
        """Only this run's topics: the broker may hold other projects' backlogs."""
        return names.with_shared_log(project_pattern(self.project), self.shared_log())

    def env(self) -> dict[str, str]:
        # This checkout first on PYTHONPATH: an editable install of another one (a CI
        # rehearsal's clone) made two runs of this bench measure that clone's code.
        env = base_env()
        shared = self.shared_log()
        if shared is not None:
            env["SETU_INGEST_LOG_TOPIC"] = shared
        return {
            **env,
            "PYTHONUNBUFFERED": "1",
            "SETU_DATA_DIR": str(self.workdir / "data"),
            "SETU_KAFKA_BOOTSTRAP": self.bootstrap,
            "SETU_REDIS_URL": self.redis,
            "SETU_API_HOST": "127.0.0.1",
            "SETU_API_PORT": str(self.api_port),
            "SETU_ALLOW_PRIVATE_ENDPOINTS": "true",
            "SETU_ADMIN_KEY": self.admin_key,
            "SETU_SECRET_KEY": Sealer.new_key(),
            "SETU_SPARK_INGEST_PATTERN": self.ingest_pattern(),
            "SETU_INGEST_METRICS_PORT": str(self.ingest_metrics_port),
            "SETU_DELIVERY_METRICS_PORT": str(self.deliver_metrics_port),
            "SETU_WORKER_ID": "latency-bench",
            **self.extra_env,
        }

    def spawn(
        self,
        name: str,
        argv: list[str],
        cwd: Path | None = None,
        env: Mapping[str, str] | None = None,
    ) -> subprocess.Popen[bytes]:
        log = (self.workdir / f"{name}.log").open("wb")
        process = subprocess.Popen(
            argv,
            env={**self.env(), **(env or {})},
            cwd=cwd or self.workdir,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        self.processes[name] = process
        return process

    def start_webhook(self) -> None:
        webhook = self.spawn(
            "webhook",
            [sys.executable, "-m", "bench.latency", "--webhook", str(self.webhook_port)],
            cwd=REPO_ROOT,
        )
        wait_for_own_server(
            webhook, "the webhook", lambda: webhook_get(self.webhook_port, "count") != b"", 20
        )

    def start(self) -> None:
        setu = shutil.which("setu") or str(Path(sys.executable).with_name("setu"))
        subprocess.run(
            [setu, "migrate"], env=self.env(), cwd=self.workdir, check=True, capture_output=True
        )
        self.start_webhook()
        api = self.spawn("api", [setu, "api"])
        health = f"http://127.0.0.1:{self.api_port}/v1/health"
        wait_for_own_server(api, "setu api", lambda: http_ok(health), 60)
        self.spawn("ingest", [setu, "ingest"])
        self.spawn("deliver", [setu, "deliver"])
        for n in range(2, self.more_workers + 2):
            more = {
                "SETU_DELIVERY_METRICS_PORT": str(any_free_port()),
                "SETU_WORKER_ID": f"latency-bench-{n}",
            }
            self.spawn(f"deliver-{n}", [setu, "deliver"], env=more)

    def check_alive(self) -> None:
        for name, process in self.processes.items():
            if process.poll() is not None:
                tail = (self.workdir / f"{name}.log").read_text(errors="replace")[-2000:]
                raise SystemExit(f"{name} exited with code {process.returncode}:\n{tail}")

    def pids(self) -> dict[str, int]:
        """The processes whose cores each phase reports, by name."""
        return {name: process.pid for name, process in self.processes.items()}

    def stop(self) -> None:
        for process in reversed(list(self.processes.values())):
            if process.poll() is None:
                process.terminate()
        for process in self.processes.values():
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()


@dataclass
class Running(Stack):
    """A stack that already runs, such as ``setu dev up``'s, measured from outside as a user
    would: through the API URL and key it printed, with its own processes and settings. Only
    the webhook is this run's own."""

    found: dict[str, int] = field(default_factory=dict)

    def start(self) -> None:
        if not http_ok(f"http://127.0.0.1:{self.api_port}/v1/health"):
            raise SystemExit(f"no API answers on 127.0.0.1:{self.api_port}")
        self.found = setu_processes()
        missing = {"api", "ingest", "deliver"} - set(self.found)
        if missing:
            raise SystemExit(f"no running `setu {' / '.join(sorted(missing))}` on this machine")
        self.start_webhook()

    def pids(self) -> dict[str, int]:
        return {**self.found, **super().pids()}

    def check_alive(self) -> None:
        super().check_alive()
        for name, pid in self.found.items():
            if not Path(f"/proc/{pid}").exists():
                raise SystemExit(f"setu {name} (pid {pid}) is gone")


def setu_processes() -> dict[str, int]:
    """The running ``setu api``, ``setu ingest`` and ``setu deliver`` (as ``setu dev up`` runs
    them: ``python -m cli.main <command>``, or the ``setu`` script), by command."""
    found: dict[str, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        for i, word in enumerate(argv[:-1]):
            launcher = Path(word).name == "setu" or (word == "cli.main" and argv[i - 1] == "-m")
            if launcher and argv[i + 1] in ("api", "ingest", "deliver"):
                found.setdefault(argv[i + 1], int(entry.name))
                break
    return found


def tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of a process and all its descendants (the ingest job's
    JVM and Python workers are children of ``setu ingest``)."""
    tick = os.sysconf("SC_CLK_TCK")
    return sum((int(f[11]) + int(f[12])) / tick for f in process_tree(pid).values())


# The load.


@dataclass
class Sent:
    due: float  # wall clock, s
    acked: float = 0.0
    status: int = 0


@dataclass
class Phase:
    name: str
    rate: float
    dedup: bool

    @classmethod
    def parse(cls, text: str) -> Phase:
        dedup = text.endswith("dup")
        return cls(text, float(text.removesuffix("dup")), dedup)


class Pool:
    """Keep-alive connections to the API, the most recently used first; at most ``most``
    open at once (a caller past it waits for one given back or lost)."""

    def __init__(self, port: int, most: int = MAX_CONNECTIONS) -> None:
        self.port = port
        self.most = most
        self.open = 0
        self.idle: list[tuple[Connection, float]] = []
        self._changed = asyncio.Condition()

    async def take(self) -> Connection:
        async with self._changed:
            while True:
                while self.idle:
                    conn, last_used = self.idle.pop()
                    if time.monotonic() - last_used < KEEP_ALIVE_S:
                        return conn
                    conn.close()
                    self.open -= 1
                if self.open < self.most:
                    self.open += 1
                    break
                await self._changed.wait()
        try:
            return await Connection.open("127.0.0.1", self.port)
        except BaseException:
            await self.lose(None)
            raise

    async def give(self, conn: Connection) -> None:
        async with self._changed:
            self.idle.append((conn, time.monotonic()))
            self._changed.notify()

    async def lose(self, conn: Connection | None) -> None:
        """A connection that failed (None: one that never opened) is closed; its place is
        free."""
        if conn is not None:
            conn.close()
        async with self._changed:
            self.open -= 1
            self._changed.notify()

    def close(self) -> None:
        for conn, _ in self.idle:
            conn.close()


async def run_load(
    port: int,
    phase: Phase,
    seconds: float,
    warmup: float,
    headers: Mapping[str, str],
    sent: dict[str, Sent] | None = None,
) -> tuple[dict[str, Sent], float]:
    """Sends the phase's messages on schedule; returns each message's timings (duplicates
    under their own key ``<id>#dup``) and when measuring began (wall clock). The timings go
    into ``sent`` as they come, when given (for a caller that stops the load early)."""
    rng = random.Random(phase.name)
    path = "/v1/projects/{p}/topics/{t}/produce".format(**headers)
    auth = {"Authorization": headers["auth"]}
    total = int(phase.rate * (warmup + seconds))
    pool = Pool(port)
    sent = {} if sent is None else sent
    tasks: set[asyncio.Task[None]] = set()

    async def send(key: str, request: bytes) -> None:
        for _ in range(3):
            conn = await pool.take()
            try:
                status, _ = await conn.send(request)
            except (asyncio.IncompleteReadError, ConnectionError):
                # The server closed a keep-alive connection before reading the request: nothing
                # was produced, so it is sent again on a new one.
                await pool.lose(conn)
                continue
            record = sent[key]
            record.acked, record.status = time.time(), status
            await pool.give(conn)
            return

    def request(n: int) -> bytes:
        message = {
            **auth,
            "X_MESSAGE_ID": f"{phase.name}-{n}",
            "X_GROUP_ID": f"g{rng.randrange(GROUPS)}",
        }
        if phase.dedup and n % 10 == 0:
            message["X_PRODUCER_ID"] = f"producer-{n % PRODUCERS}"
            message["X_SEQUENCE_ID"] = str(n)
        return request_bytes("POST", path, message, BODY)

    wall, mono = time.time(), time.monotonic()
    start = mono + 0.2
    retries: list[tuple[float, str, bytes]] = []
    for n in range(total):
        due = start + n / phase.rate
        while retries and retries[0][0] <= due:
            retry_due, key, raw = retries.pop(0)
            await _launch(send, key, raw, retry_due, wall - mono, sent, tasks)
        raw = request(n)
        key = f"{phase.name}-{n}"
        await _launch(send, key, raw, due, wall - mono, sent, tasks)
        if phase.dedup and n % 20 == 0:
            retries.append((due + 0.05, f"{key}#dup", raw))
    for retry_due, key, raw in retries:
        await _launch(send, key, raw, retry_due, wall - mono, sent, tasks)
    await asyncio.gather(*tasks)
    pool.close()
    return sent, wall + (start - mono) + warmup


async def _launch(
    send: Any,
    key: str,
    raw: bytes,
    due: float,
    offset: float,
    sent: dict[str, Sent],
    tasks: set[asyncio.Task[None]],
) -> None:
    delay = due - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)
    sent[key] = Sent(due=due + offset)
    task = asyncio.create_task(send(key, raw))
    tasks.add(task)
    task.add_done_callback(tasks.discard)


# The figures.


def stats_ms(values_s: list[float]) -> dict[str, float | int]:
    ordered = sorted(values_s)
    if not ordered:
        return {"n": 0}
    return {
        "n": len(ordered),
        "p50": round(percentile(ordered, 0.50) * 1000, 1),
        "p95": round(percentile(ordered, 0.95) * 1000, 1),
        "p99": round(percentile(ordered, 0.99) * 1000, 1),
        "max": round(ordered[-1] * 1000, 1),
    }


def record_times(bootstrap: str, topic: str) -> dict[str, float]:
    """message id -> timestamp (s) of its first record in ``topic``, read to the end."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"latency-bench-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            **quiet_kafka_config(),
        }
    )
    try:
        metadata = consumer.list_topics(topic, timeout=30).topics[topic]
        ends = {}
        for p in metadata.partitions:
            _, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)
            ends[p] = high
        consumer.assign([TopicPartition(topic, p, 0) for p in ends])
        left = {p for p, high in ends.items() if high > 0}
        found: dict[str, float] = {}
        while left:
            for message in consumer.consume(10_000, timeout=5):
                if message.error():
                    continue
                headers = dict(message.headers() or [])
                raw = headers.get(H_MESSAGE_ID) or b""
                key = raw.decode() if isinstance(raw, bytes) else raw
                found.setdefault(key, message.timestamp()[1] / 1000)
                partition, offset = message.partition(), message.offset()
                if partition is not None and offset is not None and offset + 1 >= ends[partition]:
                    left.discard(partition)
        return found
    finally:
        consumer.close()


Histograms = dict[str, list[tuple[float, float]]]


def scrape(port: int, names_wanted: list[str]) -> Histograms:
    """Cumulative buckets (le, count) of each wanted histogram, summed over label sets."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            text = r.read().decode()
    except OSError:
        return {}
    out: dict[str, dict[float, float]] = {}
    for line in text.splitlines():
        for name in names_wanted:
            if line.startswith(name + "_bucket{"):
                le = line.split('le="', 1)[1].split('"', 1)[0]
                bound = float("inf") if le == "+Inf" else float(le)
                buckets = out.setdefault(name, {})
                buckets[bound] = buckets.get(bound, 0.0) + float(line.rsplit(" ", 1)[1])
    return {name: sorted(b.items()) for name, b in out.items()}


def histogram_quantiles(before: Histograms, after: Histograms) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, buckets in after.items():
        earlier = dict(before.get(name, []))
        delta = [(le, count - earlier.get(le, 0.0)) for le, count in buckets]
        total = delta[-1][1] if delta else 0.0
        if total <= 0:
            continue
        out[name] = {"n": int(total)} | {
            f"p{int(q * 100)}": round(_quantile(delta, q) * 1000, 1) for q in (0.5, 0.95, 0.99)
        }
    return out


def _quantile(cumulative: list[tuple[float, float]], q: float) -> float:
    """Prometheus's histogram_quantile over (le, cumulative count) pairs."""
    total = cumulative[-1][1]
    rank = q * total
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in cumulative:
        if count >= rank:
            if bound == float("inf"):
                return lower_bound
            width = count - lower_count
            share = (rank - lower_count) / width if width else 1.0
            return lower_bound + (bound - lower_bound) * share
        lower_bound, lower_count = bound, count
    return lower_bound


def phase_figures(
    phase: Phase,
    sent: dict[str, Sent],
    measured_from: float,
    arrivals: Mapping[str, list[float]],
    ingest: Mapping[str, float],
    main: Mapping[str, float],
) -> dict[str, Any]:
    segments: dict[str, list[float]] = {
        k: [] for k in ("end_to_end", "produce_ack", "to_ingest_topic", "ingest", "delivery")
    }
    missing = duplicates = 0
    failed: dict[str, int] = {}
    by_window: dict[int, list[float]] = {}
    for key, record in sent.items():
        if key.endswith("#dup"):
            continue
        if record.status // 100 != 2:
            status = str(record.status or "no answer")
            failed[status] = failed.get(status, 0) + 1
            continue
        arrival = arrivals.get(key)
        if arrival is None:
            missing += 1
            continue
        duplicates += int(arrival[1]) - 1
        if record.due < measured_from:
            continue
        segments["end_to_end"].append(arrival[0] - record.due)
        by_window.setdefault(int(record.due // WINDOW_S), []).append(arrival[0] - record.due)
        segments["produce_ack"].append(record.acked - record.due)
        if key in ingest and key in main:
            segments["to_ingest_topic"].append(ingest[key] - record.due)
            segments["ingest"].append(main[key] - ingest[key])
            segments["delivery"].append(arrival[0] - main[key])
    measured = len(segments["end_to_end"])
    return {
        "rate_per_s": phase.rate,
        "dedup_share": 0.1 if phase.dedup else 0.0,
        "sent": len(sent),
        "measured": measured,
        "failed_posts": failed,
        "missing_at_webhook": missing,
        "duplicate_calls": duplicates,
        **{name: stats_ms(values) for name, values in segments.items()},
        "slowest_windows": slowest_windows(by_window),
    }


def slowest_windows(by_window: Mapping[int, list[float]], top: int = 5) -> list[dict[str, Any]]:
    """The ``top`` windows of ``WINDOW_S`` whose messages waited longest end to end (by their
    maximum), with when each began (UTC): to lay a tail beside the services' logs (a batch
    boundary, a broker's pause) rather than guess where it came from."""
    worst = sorted(by_window.items(), key=lambda item: max(item[1]), reverse=True)[:top]
    return [
        {
            "from": time.strftime("%H:%M:%S", time.gmtime(window * WINDOW_S)),
            **stats_ms(values),
        }
        for window, values in worst
    ]


def verdicts(phases: dict[str, dict[str, Any]], new_topic_s: float | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, targets in TARGETS.items():
        if name not in phases:
            continue
        for quantile, limit in targets:
            value = phases[name]["end_to_end"].get(quantile)
            out[f"{name}_{quantile}_ms"] = {
                "value": value,
                "target": limit,
                "met": value is not None and value <= limit,
            }
    if "200" in phases:
        cores = phases["200"].get("cores_busy", {}).get("ingest")
        out["200_ingest_cores"] = {
            "value": cores,
            "target": INGEST_CORES_AT_200,
            "met": cores is not None and cores <= INGEST_CORES_AT_200,
        }
    out["new_topic_first_delivery_s"] = {
        "value": new_topic_s,
        "target": NEW_TOPIC_S,
        "met": new_topic_s is not None and new_topic_s <= NEW_TOPIC_S,
    }
    for name, figures in phases.items():
        out[f"{name}_nothing_lost_or_doubled"] = (
            figures["missing_at_webhook"] == 0
            and figures["duplicate_calls"] == 0
            and not figures["failed_posts"]
        )
    return out


def report(phases: dict[str, dict[str, Any]], checks: dict[str, Any]) -> None:
    columns = ["end_to_end", "produce_ack", "to_ingest_topic", "ingest", "delivery"]
    print(f"{'phase':<9} {'segment':<38} {'p50':>8} {'p95':>8} {'p99':>8} {'max':>8}")
    for name, figures in phases.items():
        for column in columns:
            s = figures[column]
            if s.get("n"):
                row = f"{s['p50']:>8} {s['p95']:>8} {s['p99']:>8} {s['max']:>8}"
                print(f"{name:<9} {column:<38} {row}")
        for stage, s in figures.get("stages", {}).items():
            print(f"{name:<9} {'  ' + stage:<38} {s['p50']:>8} {s['p95']:>8} {s['p99']:>8}")
        print(
            f"{name:<9} sent {figures['sent']}, measured {figures['measured']}, missing "
            f"{figures['missing_at_webhook']}, duplicate calls {figures['duplicate_calls']}"
        )
        busy = ", ".join(f"{k} {v:.2f}" for k, v in figures.get("cores_busy", {}).items())
        print(f"{name:<9} cores busy: {busy}")
        slowest = ", ".join(
            f"{w['from']} max {w['max']:.0f} p99 {w['p99']:.0f}"
            for w in figures.get("slowest_windows", [])
        )
        print(f"{name:<9} slowest {WINDOW_S} s windows (UTC, end to end, ms): {slowest}")
    for name, verdict in checks.items():
        print(f"{name}: {verdict}")


@contextmanager
def stack_running(
    args: argparse.Namespace,
    project: str | None = None,
    env: dict[str, str] | None = None,
    prefix: str = "setu-latency-",
    more_workers: int = 0,
) -> Iterator[Stack]:
    """A started stack for ``project`` (default: a new name) in a new work folder, with the
    ``--env`` settings over ``env``; stopped, and its folder removed unless ``--keep``."""
    workdir = Path(tempfile.mkdtemp(prefix=prefix))
    project = project or f"lat{uuid.uuid4().hex[:8]}"
    stack: Stack
    if getattr(args, "api", None):
        stack = Running(
            workdir,
            args.bootstrap,
            args.redis,
            project,
            api_port=api_port(args.api),
            ingest_metrics_port=args.ingest_metrics_port,
            deliver_metrics_port=args.worker_metrics_port,
            admin_key=args.api_key,
        )
    else:
        stack = Stack(workdir, args.bootstrap, args.redis, project, more_workers=more_workers)
        stack.extra_env = {**(env or {}), **dict(item.split("=", 1) for item in args.env)}
    try:
        stack.start()
        yield stack
    finally:
        stack.stop()
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            print(f"logs kept in {workdir}")


def api_port(url: str) -> int:
    """The port of a loopback API's URL (the load connects to 127.0.0.1)."""
    parts = urlsplit(url)
    if parts.scheme != "http" or parts.hostname not in ("127.0.0.1", "localhost"):
        raise SystemExit(f"--api must be a plain http URL on this machine, not {url}")
    return parts.port or 80


def api_client(stack: Stack) -> httpx.Client:
    """A client of the stack's API, with its admin key."""
    auth = {"Authorization": f"Bearer {stack.admin_key}"}
    return httpx.Client(base_url=f"http://127.0.0.1:{stack.api_port}", headers=auth, timeout=30)


def create(client: httpx.Client, path: str, body: dict[str, Any]) -> None:
    """POSTs ``body`` to ``path``; anything but a 2xx ends the run."""
    response = client.post(path, json=body)
    if response.status_code not in (200, 201):
        raise SystemExit(f"POST {path}: {response.status_code} {response.text}")


def subscribe(client: httpx.Client, stack: Stack, name: str, topic: str) -> None:
    """A grouped subscription of ``topic`` to the stack's webhook."""
    create(
        client,
        f"/v1/projects/{stack.project}/subscriptions",
        {
            "name": name,
            "topic": topic,
            "grouped": True,
            "endpoint": {"url": f"http://127.0.0.1:{stack.webhook_port}/hook"},
        },
    )


def set_up(stack: Stack, timeout_s: float) -> dict[str, str]:
    p = stack.project
    with api_client(stack) as client:
        create(client, "/v1/projects", {"name": p})
        create(
            client,
            f"/v1/projects/{p}/topics",
            {"name": "orders", "grouped": True, "partitions": PARTITIONS},
        )
        subscribe(client, stack, "hook", "orders")
        warm_up(stack, client, f"/v1/projects/{p}/topics/orders/produce", timeout_s)
        auth = str(client.headers["Authorization"])
    return {"p": p, "t": "orders", "auth": auth}


def warm_up(
    stack: Stack,
    client: httpx.Client,
    produce_path: str,
    timeout_s: float,
    every_s: float = 1.0,
    prefix: str = "warm",
) -> None:
    """Produces to ``produce_path`` every ``every_s`` until a message more reached the webhook
    than when it began: the ingest job and the worker are then ready."""
    deadline = time.monotonic() + timeout_s
    before = int(webhook_get(stack.webhook_port, "count"))
    n = 0
    while int(webhook_get(stack.webhook_port, "count")) == before:
        stack.check_alive()
        if time.monotonic() > deadline:
            raise SystemExit(f"no message reached the webhook within {timeout_s:.0f} s")
        response = client.post(
            produce_path,
            content=b"{}",
            headers={"X_MESSAGE_ID": f"{prefix}-{n}", "X_GROUP_ID": "warm"},
        )
        if response.status_code // 100 != 2 and response.status_code != 503:
            raise SystemExit(f"produce: {response.status_code} {response.text}")
        n += 1
        time.sleep(every_s)


def stack_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of a benchmark that runs Setu's own stack (:class:`Stack`)."""
    parser.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="SETU_X=value",
        help="a setting for Setu's processes (to measure a change); may repeat",
    )
    parser.add_argument("--keep", action="store_true", help="keep the work folder and logs")


def wait_delivered(stack: Stack, expected: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while int(webhook_get(stack.webhook_port, "count")) < expected:
        stack.check_alive()
        if time.monotonic() > deadline:
            return  # reported as missing
        time.sleep(0.5)


def first_delivery_on_new_topic(stack: Stack, timeout_s: float) -> float:
    """Seconds from a new topic's creation (its 201) to the first webhook call of a message
    produced to it, one produced every 0.2 s meanwhile: how soon a new user sees a message
    delivered. Only called with nothing else in flight."""
    p, t = stack.project, f"fresh{secrets.token_hex(3)}"
    with api_client(stack) as client:
        create(client, f"/v1/projects/{p}/topics", {"name": t, "grouped": True})
        began = time.monotonic()
        subscribe(client, stack, f"{t}-hook", t)
        warm_up(stack, client, f"/v1/projects/{p}/topics/{t}/produce", timeout_s, 0.2, t)
        return round(time.monotonic() - began, 2)


def measure(
    args: argparse.Namespace, phases: list[Phase], env: dict[str, str] | None = None
) -> tuple[dict[str, dict[str, Any]], float]:
    """One stack (with ``env`` besides ``--env``) through every phase: each phase's figures,
    and how soon a topic created afterwards had its first message delivered."""
    results: dict[str, dict[str, Any]] = {}
    with stack_running(args, env=env) as stack:
        headers = set_up(stack, timeout_s=180)
        expected = int(webhook_get(stack.webhook_port, "count"))
        runs = []
        for phase in phases:
            length = args.warmup + args.seconds
            print(f"phase {phase.name}: {phase.rate:.0f} msg/s for {length:.0f} s", flush=True)
            before = {
                kind: scrape(port, [n for n, _ in HISTOGRAMS[kind]])
                for kind, port in (
                    ("ingest", stack.ingest_metrics_port),
                    ("deliver", stack.deliver_metrics_port),
                )
            }
            cpu_before = {n: tree_cpu_s(pid) for n, pid in stack.pids().items()}
            started = time.monotonic()
            sent, measured_from = asyncio.run(
                run_load(stack.api_port, phase, args.seconds, args.warmup, headers)
            )
            elapsed = time.monotonic() - started
            cpu = {
                name: round((tree_cpu_s(pid) - cpu_before[name]) / elapsed, 3)
                for name, pid in stack.pids().items()
            }
            expected += sum(
                1 for k, s in sent.items() if not k.endswith("#dup") and s.status // 100 == 2
            )
            wait_delivered(stack, expected, timeout_s=120)
            stages: dict[str, Any] = {}
            for kind, port in (
                ("ingest", stack.ingest_metrics_port),
                ("deliver", stack.deliver_metrics_port),
            ):
                wanted = HISTOGRAMS[kind]
                quantiles = histogram_quantiles(before[kind], scrape(port, [n for n, _ in wanted]))
                for name, stage in wanted:
                    stages[stage] = quantiles.get(name, {"missing": True})
            runs.append((phase, sent, measured_from, stages, cpu))
        arrivals = orjson.loads(webhook_get(stack.webhook_port, "dump"))
        ingest = record_times(args.bootstrap, names.ingest_topic(stack.project, "orders"))
        main_log = record_times(args.bootstrap, names.main_topic(stack.project, "orders"))
        new_topic_s = first_delivery_on_new_topic(stack, timeout_s=120)
    for phase, sent, measured_from, stages, cpu in runs:
        figures = phase_figures(phase, sent, measured_from, arrivals, ingest, main_log)
        figures["cores_busy"] = cpu
        figures["stages"] = {k: v for k, v in stages.items() if "missing" not in v}
        figures["stages_missing"] = [k for k, v in stages.items() if "missing" in v]
        results[phase.name] = figures
    return results, new_topic_s


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    service_arguments(parser)
    parser.add_argument("--phases", default="50,200,1000,200dup")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--warmup", type=float, default=15.0)
    parser.add_argument(
        "--modes",
        default="",
        help="ingest modes to measure one after the other (SETU_INGEST_MODE), e.g. "
        "micro-batch,real-time; unset: the stack's default",
    )
    stack_arguments(parser)
    parser.add_argument(
        "--api",
        help="measure a stack that already runs (`setu dev up`) through this API URL, as a "
        "user would, instead of starting one; with --api-key, and --bootstrap its Kafka",
    )
    parser.add_argument("--api-key", default=os.environ.get("SETU_API_KEY", ""))
    parser.add_argument("--ingest-metrics-port", type=int, default=9465)
    parser.add_argument("--worker-metrics-port", type=int, default=9464)
    parser.add_argument("--webhook", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.api and (args.modes or args.env):
        parser.error("--modes and --env set up a stack of the bench's own; not with --api")
    if args.api and not args.api_key:
        parser.error("--api needs --api-key (or SETU_API_KEY): the admin key `dev up` printed")
    if args.webhook is not None:
        serve_webhook(args.webhook)
        return 0
    quiet_client_logs()
    phases = [Phase.parse(p) for p in args.phases.split(",")]
    modes = [m for m in args.modes.split(",") if m] or [""]
    by_mode: dict[str, Any] = {}
    for mode in modes:
        if mode:
            print(f"ingest mode {mode}", flush=True)
        env = {"SETU_INGEST_MODE": mode} if mode else None
        results, new_topic_s = measure(args, phases, env)
        checks = verdicts(results, new_topic_s)
        report(results, checks)
        print(f"a new topic's first message delivered in {new_topic_s} s")
        by_mode[mode or "default"] = {
            "phases": results,
            "verdicts": checks,
            "new_topic_first_delivery_s": new_topic_s,
        }
    settings = {
        "stack": f"running, {args.api}" if args.api else "the bench's own",
        "env": args.env,
        "seconds": args.seconds,
        "warmup": args.warmup,
        "groups": GROUPS,
        "partitions": PARTITIONS,
    }
    if modes == [""]:
        figures = {"settings": settings, **by_mode["default"]}
    else:
        figures = {"settings": settings, "modes": by_mode}
    path = write_result("latency", figures, f"-{args.label}" if args.label else "")
    print(f"written to {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
