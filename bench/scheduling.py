"""Scheduled delivery (docs/scheduling.md): how late a burst of messages due at the same moment
is called, when their records wait in the worker's memory (due within a minute of being read)
against when each must be read back from the main log (due later), in one run.

    python -m bench.scheduling [--bootstrap 127.0.0.1:9092] [--redis redis://127.0.0.1:6379/0]
                               [--groups 2000] [--near-s 20] [--far-s 75]

Per row: ``--groups`` groups on one partition, each with one message scheduled for the same
moment and one plain message behind it, written to the main log as the ingest job would; a
``setu deliver`` worker (bench.delivery's) holds them, and the webhook (a process of its own)
records, for every call of a scheduled message, how long after its time it came (never
before: a call before its time is counted and fails the run), and when each group's second
message came. Reported: the lateness p50/p99/max of the scheduled calls, the time from the
moment to the last group's second message, and the worker's CPU over the burst. Figures are
printed and written as JSON under bench/results/.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
import urllib.request
import uuid
from typing import Any

import orjson
import redis
from confluent_kafka import Producer

from bench.delivery import bench_topic, proc_status, stop, take_request
from bench.machine import write_result
from cli.ports import any_free_port
from setu.envelope import Envelope
from setu.model import Endpoint, RetryPolicy, Subscription
from state import keys
from state.kafka_admin import KafkaTopics

BODY = b'{"n": 1}'


class _Webhook(asyncio.Protocol):
    """Answers 200 at once; records each scheduled call's lateness (ms) and when each group's
    plain message came (epoch ms)."""

    late: list[float] = []
    early = 0
    followers: list[float] = []

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
                body = orjson.dumps(
                    {"late": self.late, "early": self.early, "followers": self.followers}
                )
                self.transport.write(
                    b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
                )
                continue
            now = time.time() * 1000
            at = head.find(b"\r\nX_DELIVER_AT: ")
            if at >= 0:
                due = int(head[at + 16 : head.find(b"\r\n", at + 2)])
                _Webhook.late.append(now - due)
                _Webhook.early += now < due
            else:
                _Webhook.followers.append(now)
            self.transport.write(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")


def serve_webhook(port: int) -> None:
    import uvloop

    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(_Webhook, "127.0.0.1", port)
        print("ready", flush=True)
        await server.serve_forever()

    uvloop.run(main())


def stats(port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats", timeout=10) as response:
        found: dict[str, Any] = orjson.loads(response.read())
        return found


def produce(bootstrap: str, topic: str, groups: int, due_ms: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 20})
    for i in range(groups):
        for deliver_at in (due_ms, 0):
            env = Envelope(
                uuid.uuid4().hex, BODY, group_id=f"g{i}", produced_at_ms=1, deliver_at_ms=deliver_at
            )
            headers: list[tuple[str, str | bytes | None]] = list(env.kafka_headers())
            producer.produce(topic, value=BODY, key=env.key, partition=0, headers=headers)
        if i % 1000 == 0:
            producer.poll(0)
    producer.flush(60)


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def run_row(args: argparse.Namespace, row: str, delay_s: float) -> dict[str, Any]:
    project = f"bench{uuid.uuid4().hex[:8]}"
    admin = KafkaTopics(args.bootstrap)
    topic = bench_topic(project, True)
    admin.ensure_topic(topic)
    sub = Subscription(project, "s", "t", Endpoint("http://x/"), grouped=True)
    admin.ensure_subscription(sub, topic)
    port = any_free_port()
    hook = subprocess.Popen(
        [sys.executable, "-m", "bench.scheduling", "--serve-webhook", str(port)],
        stdout=subprocess.PIPE,
    )
    worker: subprocess.Popen[bytes] | None = None
    try:
        assert hook.stdout is not None
        hook.stdout.readline()
        due = int(time.time() * 1000 + delay_s * 1000)
        produce(args.bootstrap, f"setu.{project}.t", args.groups, due)
        config = {
            "project": project,
            "subscription": "s",
            "topic": "t",
            "grouped": True,
            "url": f"http://127.0.0.1:{port}/hook",
            "bootstrap": args.bootstrap,
            "redis": args.redis,
            "max_in_flight": 256,
            "delays_ms": list(RetryPolicy().delays_ms),
            "attempt_log_hours": 24,
        }
        worker = subprocess.Popen(
            [sys.executable, "-m", "bench.delivery", "--serve-worker", json.dumps(config)]
        )
        # The worker holds them all well before the moment; its CPU is counted from just before.
        while time.time() * 1000 < due - 2_000:
            time.sleep(0.2)
        cpu_before = proc_status(worker.pid)["cpu_ms"]
        deadline = time.monotonic() + delay_s + 300
        found = stats(port)
        while len(found["followers"]) < args.groups:
            if time.monotonic() > deadline or worker.poll() is not None:
                raise RuntimeError(f"row {row}: {len(found['followers'])} groups done")
            time.sleep(0.5)
            found = stats(port)
        cpu_ms = proc_status(worker.pid)["cpu_ms"] - cpu_before
        late = found["late"]
        return {
            "row": row,
            "groups": args.groups,
            "delay_s": delay_s,
            "scheduled_calls": len(late),
            "calls_before_their_time": found["early"],
            "late_ms_p50": round(percentile(late, 0.5), 1),
            "late_ms_p99": round(percentile(late, 0.99), 1),
            "late_ms_max": round(max(late), 1),
            "last_group_done_after_ms": round(max(found["followers"]) - due, 1),
            "worker_cpu_ms_over_burst": cpu_ms,
            "load_average_1m": round(os.getloadavg()[0], 2),
        }
    finally:
        if worker is not None:
            stop(worker)
        hook.kill()
        hook.wait()
        admin.delete_subscription(project, "s")
        admin.delete_topic(topic)
        client = redis.Redis.from_url(args.redis)
        found_keys = list(client.scan_iter(match=keys.subscription_pattern(project, "s")))
        if found_keys:
            client.delete(*found_keys)
        client.close()


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
    parser.add_argument("--groups", type=int, default=2_000)
    parser.add_argument("--near-s", type=float, default=20.0)
    parser.add_argument("--far-s", type=float, default=75.0)
    parser.add_argument("--serve-webhook", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_webhook:
        serve_webhook(args.serve_webhook)
        return 0
    rows = {}
    for row, delay in (("in-memory", args.near_s), ("read-back", args.far_s)):
        result = rows[row] = run_row(args, row, delay)
        print(
            f"{row:>10}  {result['scheduled_calls']} due at once, {delay:g} s ahead: late p50 "
            f"{result['late_ms_p50']} ms, p99 {result['late_ms_p99']} ms, max "
            f"{result['late_ms_max']} ms; every group done {result['last_group_done_after_ms']}"
            f" ms after; early {result['calls_before_their_time']}; worker CPU "
            f"{result['worker_cpu_ms_over_burst']} ms",
            flush=True,
        )
    document = {
        "benchmark": "scheduling",
        "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "rows": rows,
    }
    out = write_result("scheduling", document, "")
    print(f"written to {out}")
    early = sum(r["calls_before_their_time"] for r in rows.values())
    return 1 if early else 0


if __name__ == "__main__":
    raise SystemExit(main())
