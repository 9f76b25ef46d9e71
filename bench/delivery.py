"""Delivery benchmark, modelled on Confluent Parallel Consumer's published table: 10,000
messages on one partition to a webhook that answers after a random 0-5 ms, for 1, 10, 100 and
10,000 groups and ungrouped; then a failure-isolation run and a memory run.

    python -m bench.delivery [--bootstrap 127.0.0.1:9092] [--redis redis://127.0.0.1:6379/0]
                             [--messages 10000] [--memory-messages 1000000]
                             [--rows 1,10,100,10000,ungrouped,isolation,memory]

Each row gets its own topic (one partition) and subscription. Messages are written to the main
log first, as the ingest job would; then a ``setu deliver`` worker (a process of its own, with a
fixed subscription list) starts, and the webhook (another process, uvloop) timestamps every
call. A row's rate is messages / (last call - first call), so group-join time is not counted.

- isolation: 10,000 groups, 10% of them always answer 500 (their messages park in a 60 s retry
  tier); the healthy groups' message rate is compared with the rate of the same groups'
  messages in the all-healthy 10,000-group row (and, for reference, with that row's total).
- flaky: 1,000 groups of 10 messages (``--messages``), two retry tiers of 100 and 300 ms; in
  every tenth group each message fails its first two calls with 503 and then gets 200 (a
  merely flaky endpoint). Reported: the flaky groups' messages delivered per second, the
  share of their messages dead-lettered (target 0: every message has its own three
  attempts), and the healthy groups' rate beside them.
- memory: one message per group for ``--memory-messages`` distinct groups, webhook answering at
  once; the worker's peak RSS (VmHWM) is reported.
- 10000-nolog: the 10,000-group row with the attempt log off (``SETU_ATTEMPT_LOG_HOURS=0``);
  against the 10000 row of the same run it gives what recording every attempt costs (target:
  at most 10 % of the throughput), and the 10000 row reports the log's Redis memory per
  message.
- 10000-traced: the 10,000-group row with tracing on (a span per webhook call, exported with
  OTLP to a local sink); against the 10000 row it gives what tracing costs (target: at most
  10 %; off, nothing is made: docs/latency.md, "Tracing").
- 10000-filtered: the 10,000-group row with a three-condition filter on the JSON body that
  every message passes (``FILTER``); against the 10000 row it gives what judging the body
  costs (target: at least 0.9 of the unfiltered rate; docs/policies.md §1).
- 10000-rate: the 10,000-group row with ``rate_limit_per_second`` set far above reach, so
  every call takes its token from the rate bucket the subscription's workers share in Redis
  (docs/policies.md §5); against the 10000 row it gives what the shared limit costs. (Every
  row shares ``max_in_flight`` through Redis: a script call per worker every 250 ms.)

Figures are printed and written as JSON under bench/results/. Targets (2-core machine):
10,000 groups >= 4,700 messages/s and within 1.25x of the ungrouped time; healthy groups keep
>= 90% of their all-healthy rate while 10% fail; worker RSS <= 300 MB.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import orjson
import redis
from confluent_kafka import Producer

from bench.machine import OtlpSink, quiet_kafka_config, write_result
from cli.ports import any_free_port
from setu.envelope import Envelope
from setu.model import Endpoint, Notifications, RetryPolicy, Subscription, Topic
from setu.policies import Policies, parse_filter
from state import keys
from state.kafka_admin import KafkaTopics

BODY = b'{"order": 12345, "items": [1, 2, 3], "note": "' + b"x" * 180 + b'"}'
ROWS = (
    "1",
    "10",
    "100",
    "10000",
    "10000-nolog",
    "10000-rate",
    "10000-traced",
    "10000-filtered",
    "ungrouped",
    "isolation",
    "flaky",
    "memory",
)
# The 10000-rate row's limit: far above what one worker reaches, so every call goes through
# the shared rate bucket without being held back by it.
RATE_ROW_LIMIT = 1_000_000.0
# The 10000-filtered row's filter: three body tests every message of the row passes.
FILTER = {
    "all": [
        {"body": "order", "gte": 1},
        {"body": "items.2", "in": [3, 4]},
        {"body": "note", "prefix": "x"},
    ]
}
FLAKY_DELAYS_MS = (100, 300)
FLAKY_FAILURES = 2  # failed calls per message of a flaky group, within FLAKY_DELAYS_MS's tiers


# The webhook: a process of its own, timestamping every call.


def take_request(buffer: bytes) -> tuple[bytes | None, bytes]:
    """The head of the first whole HTTP/1.1 request in ``buffer`` (its body dropped) and what
    follows it; None and ``buffer`` as it is while the request is incomplete."""
    end = buffer.find(b"\r\n\r\n")
    if end < 0:
        return None, buffer
    head = buffer[:end]
    length = 0
    at = head.find(b"content-length: ")
    if at >= 0:
        stop = head.find(b"\r\n", at)
        length = int(head[at + 16 : stop if stop >= 0 else len(head)])
    if len(buffer) < end + 4 + length:
        return None, buffer
    return head, buffer[end + 4 + length :]


class _Webhook(asyncio.Protocol):
    """Minimal HTTP/1.1 server: answers after a random 0..max_delay ms, 500 for failing
    groups (every tenth, when asked) or 503 to the first calls of each message of a flaky
    group (every tenth, when asked), and keeps counts for GET /stats."""

    stats: dict[str, Any] = {}
    max_delay_s = 0.005
    fail_tenth = False
    flaky_tenth = False
    calls: dict[bytes, int] = {}

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: Any = transport
        self.buffer = b""

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            head, self.buffer = take_request(self.buffer)
            if head is None:
                return
            if head.startswith(b"GET /stats"):
                body = orjson.dumps(self.stats)
                self.transport.write(
                    b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
                )
                continue
            self._call(head)

    def _call(self, head: bytes) -> None:
        group = b""
        at = head.find(b"\r\nX_GROUP_ID: ")
        if at >= 0:
            group = head[at + 14 : head.find(b"\r\n", at + 2)]
        tenth = bool(group and int(group[1:]) % 10 == 0)
        failing = self.fail_tenth and tenth
        status = b"500 Internal Server Error" if failing else b"200 OK"
        flaky = self.flaky_tenth and tenth
        if flaky:
            at = head.find(b"\r\nX_MESSAGE_ID: ")
            message = head[at + 16 : head.find(b"\r\n", at + 2)]
            calls = self.calls[message] = self.calls.get(message, 0) + 1
            if calls <= FLAKY_FAILURES:
                failing, status = True, b"503 Service Unavailable"
        delay = random.random() * self.max_delay_s
        loop = asyncio.get_running_loop()
        loop.call_later(delay, self._answer, status, failing, flaky)

    def _answer(self, status: bytes, failing: bool, flaky: bool) -> None:
        now = time.monotonic()
        s = self.stats
        if failing:
            s["failed"] += 1
        else:
            s["ok"] += 1
            s["first"] = s["first"] or now
            s["last"] = now
            if flaky:
                s["flaky_ok"] += 1
                s["flaky_first"] = s["flaky_first"] or now
                s["flaky_last"] = now
        self.transport.write(b"HTTP/1.1 " + status + b"\r\ncontent-length: 0\r\n\r\n")


def serve_webhook(port: int, max_delay_ms: float, fail_tenth: bool, flaky_tenth: bool) -> None:
    import uvloop

    _Webhook.stats = {
        "ok": 0,
        "failed": 0,
        "first": 0.0,
        "last": 0.0,
        "flaky_ok": 0,
        "flaky_first": 0.0,
        "flaky_last": 0.0,
    }
    _Webhook.max_delay_s = max_delay_ms / 1000
    _Webhook.fail_tenth = fail_tenth
    _Webhook.flaky_tenth = flaky_tenth

    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(_Webhook, "127.0.0.1", port)
        print("ready", flush=True)
        await server.serve_forever()

    uvloop.run(main())


# The worker: ``serve`` with a fixed subscription list.


class _Fixed:
    def __init__(self, subs: list[Subscription], topic: Topic) -> None:
        self._subs = subs
        self._topic = topic

    def list_subscriptions(self) -> list[Subscription]:
        return self._subs

    def get_topic(self, project: str, name: str) -> Topic:
        return self._topic

    def pause_by_policy(self, project: str, name: str, reason: str) -> None:
        raise RuntimeError(f"the benchmark's subscription would pause: {reason}")

    def list_notifications(self) -> list[Notifications]:
        return []


def serve_worker(config: dict[str, Any]) -> None:
    from delivery.worker import _run_loop, serve
    from setu import tracing
    from setu.settings import Settings

    sub = Subscription(
        project=config["project"],
        name=config["subscription"],
        topic=config["topic"],
        endpoint=Endpoint(config["url"], timeout_ms=10_000),
        grouped=config["grouped"],
        retry=RetryPolicy(delays_ms=tuple(config["delays_ms"])),
        max_in_flight=config["max_in_flight"],
        rate_limit_per_second=config.get("rate_limit_per_second"),
        # The flaky row measures each message's own retry budget. Its last seconds call only
        # flaky groups, two failures in three calls: the breaker would rightly open and hold
        # the row for its open periods (docs/policies.md §2).
        policies=Policies(
            circuit_breaker=None if config.get("no_breaker") else Policies().circuit_breaker,
            filter=parse_filter(config["filter"]) if config.get("filter") else None,
        ),
    )
    topic = bench_topic(sub.project, sub.grouped)  # as run_row made it
    settings = Settings(
        kafka_bootstrap=config["bootstrap"],
        redis_url=config["redis"],
        worker_id=f"bench-{config['project']}",
        allow_private_endpoints=True,  # the benchmark's webhook listens on loopback
        attempt_log_hours=config["attempt_log_hours"],
        kafka_replication_factor=config.get("replication_factor", 1),
    )
    tracing.configure("setu-deliver")  # on in the -traced row (OTEL_EXPORTER_OTLP_ENDPOINT)
    profile_to = os.environ.get("SETU_BENCH_PROFILE")
    if not profile_to:
        try:
            _run_loop(serve(settings, _Fixed([sub], topic)))
        finally:
            tracing.current().shutdown()
        return
    import cProfile

    with cProfile.Profile() as profile:
        _run_loop(serve(settings, _Fixed([sub], topic)))
    profile.dump_stats(profile_to)


# The driver.


def get_stats(port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats", timeout=10) as response:
        stats: dict[str, Any] = orjson.loads(response.read())
        return stats


def proc_status(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (peak) in kB, and CPU seconds, of a process (Linux /proc)."""
    out: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            out[name] = int(value.split()[0])
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    out["cpu_ms"] = (int(fields[11]) + int(fields[12])) * 1000 // os.sysconf("SC_CLK_TCK")
    return out


def produce(bootstrap: str, topic: str, messages: int, groups: int | None) -> float:
    """Writes ``messages`` to partition 0 of ``topic`` (group i % groups, or none); seconds."""
    producer = Producer(
        {
            **quiet_kafka_config(),
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 20,
            "batch.size": 1_000_000,
            "queue.buffering.max.messages": 2_000_000,
        }
    )
    started = time.monotonic()
    for i in range(messages):
        group = None if groups is None else f"g{i % groups}"
        env = Envelope(f"m{i}", BODY, group_id=group, produced_at_ms=1)
        headers: list[tuple[str, str | bytes | None]] = list(env.kafka_headers())
        while True:
            try:
                producer.produce(topic, value=BODY, key=env.key, partition=0, headers=headers)
                break
            except BufferError:
                producer.poll(0.05)
        if i % 10_000 == 0:
            producer.poll(0)
    producer.flush(120)
    return time.monotonic() - started


def row_groups(row: str, messages: int) -> int | None:
    """How many groups a row's messages fall into (None: ungrouped)."""
    if row == "ungrouped":
        return None
    if row == "isolation":
        return 10_000
    if row == "flaky":
        return max(1, messages // 10)
    if row == "memory":
        return messages
    return int(row.split("-")[0])


def flaky_figures(
    stats: dict[str, Any], messages: int, elapsed: float, dead: int
) -> dict[str, Any]:
    """The flaky row's own figures: its flaky groups (every tenth) and the healthy rest."""
    groups = row_groups("flaky", messages) or 1
    flaky_messages = sum(1 for i in range(messages) if (i % groups) % 10 == 0)
    flaky_s = stats["flaky_last"] - stats["flaky_first"]
    healthy = stats["ok"] - stats["flaky_ok"]
    return {
        "flaky_messages": flaky_messages,
        "flaky_delivered": stats["flaky_ok"],
        "flaky_messages_per_s": round(stats["flaky_ok"] / flaky_s) if flaky_s else None,
        "flaky_share_dead_lettered": round(dead / flaky_messages, 4),
        "healthy_messages_per_s": round(healthy / elapsed) if elapsed else None,
    }


def bench_topic(project: str, grouped: bool) -> Topic:
    """The topic of every row: one partition, an hour's retention."""
    return Topic(project, "t", grouped=grouped, partitions=1, retention_hours=1)


def run_row(args: argparse.Namespace, row: str) -> dict[str, Any]:
    project = f"bench{uuid.uuid4().hex[:8]}"
    messages = args.memory_messages if row == "memory" else args.messages
    groups = row_groups(row, messages)
    admin = KafkaTopics(args.bootstrap)
    topic = bench_topic(project, groups is not None)
    sub_name = "s"
    admin.ensure_topic(topic)
    sub = Subscription(
        project,
        sub_name,
        "t",
        Endpoint("http://x/"),
        grouped=groups is not None,
        retry=RetryPolicy(delays_ms=FLAKY_DELAYS_MS if row == "flaky" else (60_000,)),
    )
    admin.ensure_subscription(sub, topic)
    port = any_free_port()
    hook = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bench.delivery",
            "--serve-webhook",
            str(port),
            "--max-delay-ms",
            "0" if row == "memory" else "5",
            *(["--fail-tenth"] if row == "isolation" else []),
            *(["--flaky-tenth"] if row == "flaky" else []),
        ],
        stdout=subprocess.PIPE,
    )
    worker: subprocess.Popen[bytes] | None = None
    sink: OtlpSink | None = None
    try:
        assert hook.stdout is not None
        hook.stdout.readline()
        main = f"setu.{project}.t"
        produce_s = produce(args.bootstrap, main, messages, groups)
        config = {
            "project": project,
            "subscription": sub_name,
            "topic": "t",
            "grouped": groups is not None,
            "url": f"http://127.0.0.1:{port}/hook",
            "bootstrap": args.bootstrap,
            "redis": args.redis,
            "max_in_flight": args.max_in_flight,
            "delays_ms": list(sub.retry.delays_ms),
            "attempt_log_hours": 0 if row.endswith("-nolog") else 24,
            "rate_limit_per_second": RATE_ROW_LIMIT if row.endswith("-rate") else None,
            "no_breaker": row == "flaky",
            "filter": FILTER if row.endswith("-filtered") else None,
        }
        if row.endswith("-traced"):
            sink = OtlpSink()
        worker = subprocess.Popen(
            [sys.executable, "-m", "bench.delivery", "--serve-worker", json.dumps(config)],
            env={
                **{k: v for k, v in os.environ.items() if not k.startswith("OTEL_")},
                **(sink.env() if sink else {}),
            },
        )
        expected = messages - (messages // 10 if row == "isolation" else 0)
        stats, peak, cpu_at_start = watch_row(args, row, port, worker, expected, project)
        elapsed = stats["last"] - stats["first"]
        busy_ms = peak["cpu_ms"] - (cpu_at_start or 0)
        result = {
            "row": row,
            "messages": messages,
            "groups": groups,
            "delivered": stats["ok"],
            "failed_calls": stats["failed"],
            "seconds": round(elapsed, 3),
            "messages_per_s": round(stats["ok"] / elapsed) if elapsed > 0 else None,
            "worker_rss_mb": round(peak["VmRSS"] / 1024, 1),
            "worker_peak_rss_mb": round(peak["VmHWM"] / 1024, 1),
            "worker_cpu_s": round(peak["cpu_ms"] / 1000, 2),
            # CPU per delivered message once delivery had started (startup not counted).
            "worker_cpu_us_per_msg": round(busy_ms * 1000 / max(stats["ok"], 1)),
            "produce_s": round(produce_s, 2),
            "load_average_1m": round(os.getloadavg()[0], 2),
            "dead_lettered": dead_lettered(args.redis, project, sub_name),
        }
        if row == "flaky":
            result.update(flaky_figures(stats, messages, elapsed, result["dead_lettered"]))
        stop(worker)  # it flushes its attempt log (and its spans) as it stops
        if sink is not None:
            if not sink.received.wait(15):
                raise RuntimeError(f"row {row}: the worker exported no span")
            result["exported_span_bytes"] = sink.bytes
        if not row.endswith("-nolog"):
            result["attempt_log_bytes_per_message"] = attempt_log_bytes(
                args.redis, project, sub_name, stats["ok"]
            )
        return result
    finally:
        if worker is not None:
            stop(worker)
        if sink is not None:
            sink.close()
        hook.kill()
        hook.wait()
        admin.delete_subscription(project, sub_name)
        admin.delete_topic(topic)
        client = redis.Redis.from_url(args.redis)
        found = list(client.scan_iter(match=keys.subscription_pattern(project, sub_name)))
        if found:
            client.delete(*found)
        client.close()


def watch_row(
    args: argparse.Namespace,
    row: str,
    port: int,
    worker: subprocess.Popen[bytes],
    expected: int,
    project: str,
) -> tuple[dict[str, Any], dict[str, int], int | None]:
    """Waits until the webhook took every message a row expects (less those dead-lettered);
    returns its stats, the worker's last /proc figures and its CPU when the first call came."""
    deadline = time.monotonic() + args.timeout
    cpu_at_start: int | None = None
    while True:
        stats = get_stats(port)
        peak = proc_status(worker.pid)
        if cpu_at_start is None and stats["ok"]:
            cpu_at_start = peak["cpu_ms"]
        if stats["ok"] >= expected - dead_lettered(args.redis, project, "s"):
            return stats, peak, cpu_at_start
        if time.monotonic() > deadline or worker.poll() is not None:
            raise RuntimeError(f"row {row}: {stats['ok']} of {expected} after the deadline")
        time.sleep(0.05)


def stop(worker: subprocess.Popen[bytes]) -> None:
    if worker.poll() is None:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(60)
        except subprocess.TimeoutExpired:
            worker.kill()


def attempt_log_bytes(redis_url: str, project: str, subscription: str, messages: int) -> int:
    """Redis memory the subscription's attempt log holds, per delivered message (read once
    the worker stopped, which flushed its last entries)."""
    client = redis.Redis.from_url(redis_url)
    try:
        pattern = keys.attempts(project, subscription, 0).rsplit(":", 1)[0] + ":*"
        total = sum(int(client.memory_usage(k) or 0) for k in client.scan_iter(match=pattern))
        return round(total / max(messages, 1))
    finally:
        client.close()


def dead_lettered(redis_url: str, project: str, subscription: str) -> int:
    """The subscription's count of messages moved to its DLQ (parked ones included)."""
    client = redis.Redis.from_url(redis_url)
    try:
        value = client.hget(keys.counters(project, subscription), "dead_lettered")
        return int(value or 0)
    finally:
        client.close()


def verdicts(rows: dict[str, dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    many = rows.get("10000")
    loose = rows.get("ungrouped")
    if many:
        out["10000_groups_at_least_4700_per_s"] = many["messages_per_s"] >= 4700
    if many and loose:
        ratio = many["seconds"] / loose["seconds"]
        out["10000_groups_time_over_ungrouped"] = round(ratio, 3)
        out["10000_groups_within_1.25x_of_ungrouped"] = ratio <= 1.25
    iso = rows.get("isolation")
    if iso and many:
        # The healthy groups' own throughput: their messages (9 in 10) per second, in the
        # isolation run and in the all-healthy run of the same 10,000 groups.
        healthy = iso["delivered"]
        with_failures = healthy / iso["seconds"]
        all_healthy = healthy / many["seconds"]
        out["healthy_groups_rate_with_10pct_failing"] = round(with_failures)
        out["healthy_groups_rate_all_healthy"] = round(all_healthy)
        out["healthy_groups_keep_share"] = round(with_failures / all_healthy, 3)
        out["healthy_groups_keep_90_percent"] = with_failures / all_healthy >= 0.9
        # For reference: healthy deliveries per second against all deliveries per second.
        out["healthy_rate_over_all_healthy_total_rate"] = round(
            iso["messages_per_s"] / many["messages_per_s"], 3
        )
    flaky = rows.get("flaky")
    if flaky:
        out["flaky_groups_messages_per_s"] = flaky["flaky_messages_per_s"]
        out["flaky_groups_share_dead_lettered"] = flaky["flaky_share_dead_lettered"]
        out["flaky_groups_nothing_dead_lettered"] = flaky["dead_lettered"] == 0
    nolog = rows.get("10000-nolog")
    if many and nolog:
        share = many["messages_per_s"] / nolog["messages_per_s"]
        out["attempt_log_keeps_share"] = round(share, 3)
        out["attempt_log_costs_at_most_10_percent"] = share >= 0.9
    traced = rows.get("10000-traced")
    if many and traced:
        share = traced["messages_per_s"] / many["messages_per_s"]
        out["tracing_keeps_share"] = round(share, 3)
        out["tracing_costs_at_most_10_percent"] = share >= 0.9
    filtered = rows.get("10000-filtered")
    if many and filtered:
        share = filtered["messages_per_s"] / many["messages_per_s"]
        out["body_filter_keeps_share"] = round(share, 3)
        out["body_filter_keeps_90_percent"] = share >= 0.9
    rated = rows.get("10000-rate")
    if many and rated:
        out["shared_rate_limit_keeps_share"] = round(
            rated["messages_per_s"] / many["messages_per_s"], 3
        )
    mem = rows.get("memory")
    if mem:
        out["worker_peak_rss_at_most_300_mb"] = mem["worker_peak_rss_mb"] <= 300
    return out


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
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--memory-messages", type=int, default=1_000_000)
    parser.add_argument("--max-in-flight", type=int, default=256)
    parser.add_argument("--rows", default=",".join(ROWS))
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--label", default="", help="a suffix for the result file's name")
    parser.add_argument("--serve-webhook", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--max-delay-ms", type=float, default=5.0, help=argparse.SUPPRESS)
    parser.add_argument("--fail-tenth", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--flaky-tenth", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--serve-worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_webhook:
        serve_webhook(args.serve_webhook, args.max_delay_ms, args.fail_tenth, args.flaky_tenth)
        return 0
    if args.serve_worker:
        serve_worker(json.loads(args.serve_worker))
        return 0

    rows: dict[str, dict[str, Any]] = {}
    for row in args.rows.split(","):
        result = run_row(args, row)
        rows[row] = result
        print(
            f"{row:>10}  {result['messages']:>8} msgs  {result['seconds']:>8.2f} s  "
            f"{result['messages_per_s'] or 0:>7} msg/s  peak RSS {result['worker_peak_rss_mb']} MB"
            f"  worker CPU {result['worker_cpu_us_per_msg']} us/msg"
            f"  load {result['load_average_1m']}",
            flush=True,
        )
    document = {
        "benchmark": "delivery",
        "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "rows": rows,
        "verdicts": verdicts(rows),
    }
    print(json.dumps(document["verdicts"], indent=2))
    out = write_result("delivery", document, f"-{args.label}" if args.label else "")
    print(f"written to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
