"""Many streaming producers at once, on the real stack: every message durable and delivered
once, the API's memory and CPU, and no session starved.

    python -m bench.stream_sessions [--bootstrap 127.0.0.1:9092] [--redis redis://...]
                                    [--sessions 1000] [--rate-each 2] [--seconds 300]
                                    [--keys 8]

The stack is ``bench.latency``'s (``setu api`` with its streaming listener, ``setu ingest``,
one ``setu deliver``, the timestamping webhook), one grouped topic of 6 partitions and one
grouped subscription to the webhook. ``--sessions`` producers of ``setu.client``, each on a
connection of its own with a producer id of its own (``s{n}``, also its group), send
``--rate-each`` messages a second each on an open-loop schedule with a random phase, for
``--seconds``. Their API keys are spread over ``--keys`` producer keys of the project: one key
may hold a quarter of a replica's sessions by default (docs/streaming.md).

Reported:

- **durable**: messages sent and acknowledged; each session's ACK latency (from the scheduled
  send to the ACK that covered it), its p99 and the worst session's, and how far its sends
  fell behind their schedule. A session is *starved* when its ACK p99 or its send lag exceeds
  ``--starved-ms``.
- **delivered**: every acknowledged message called at the webhook once (missing, repeated),
  and in order within its group.
- **the API process**: RSS every 5 s (first, last, highest; the last minute's median against
  the first minute's), cores busy and CPU per message; the other processes' cores.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from bench.http_load import percentile
from bench.latency import (
    BODY,
    Stack,
    api_client,
    set_up,
    stack_arguments,
    stack_running,
    tree_cpu_s,
    wait_delivered,
    webhook_get,
)
from bench.machine import quiet_client_logs, service_arguments, write_result
from cli.ports import any_free_port
from setu.client import AsyncStreamProducer

SAMPLE_EVERY_S = 5.0
CONNECT_AT_ONCE = 50


@dataclass
class Session:
    """One producer's schedule and what came of it."""

    producer_id: str
    scheduled: dict[int, float] = field(default_factory=dict)  # sequence -> monotonic due
    latencies: list[float] = field(default_factory=list)
    worst_lag_s: float = 0.0
    point: int = 0

    def durable(self, point: int) -> None:
        now = time.monotonic()
        for sequence in range(self.point, point):
            due = self.scheduled.pop(sequence, None)
            if due is not None:
                self.latencies.append(now - due)
        self.point = max(self.point, point)


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def producer_keys(stack: Stack, count: int) -> list[str]:
    made = []
    with api_client(stack) as client:
        for n in range(count):
            response = client.post(
                f"/v1/projects/{stack.project}/keys",
                json={"name": f"streams-{n}", "role": "producer"},
            )
            if response.status_code != 201:
                raise SystemExit(f"key: {response.status_code} {response.text}")
            made.append(str(response.json()["key"]))
    return made


async def run_sessions(
    args: argparse.Namespace, stack: Stack, keys: list[str], stream_port: int
) -> dict[str, Any]:
    address = f"127.0.0.1:{stream_port}"
    sessions = [Session(f"s{n}") for n in range(args.sessions)]
    producers = [
        AsyncStreamProducer(
            address,
            keys[n % len(keys)],
            stack.project,
            "orders",
            session.producer_id,
            program="bench.stream_sessions",
            on_durable=session.durable,
        )
        for n, session in enumerate(sessions)
    ]
    began = time.monotonic()
    for start in range(0, len(producers), CONNECT_AT_ONCE):
        await asyncio.gather(*(p.start() for p in producers[start : start + CONNECT_AT_ONCE]))
    connected_s = time.monotonic() - began
    print(f"{len(producers)} sessions open in {connected_s:.1f} s", flush=True)

    api_pid = stack.processes["api"].pid
    memory: list[tuple[float, int]] = []
    cpu_before = {name: tree_cpu_s(pid) for name, pid in stack.pids().items()}
    started = time.monotonic()
    ends = started + args.seconds
    interval = 1.0 / args.rate_each

    async def sample() -> None:
        while True:
            memory.append((round(time.monotonic() - started, 1), rss_kib(api_pid)))
            await asyncio.sleep(SAMPLE_EVERY_S)

    async def one(producer: AsyncStreamProducer, session: Session) -> None:
        due = started + random.uniform(0, interval)
        while due < ends:
            now = time.monotonic()
            if due > now:
                await asyncio.sleep(due - now)
            session.scheduled[producer.next_sequence] = due
            await producer.send(BODY, group_id=session.producer_id)
            session.worst_lag_s = max(session.worst_lag_s, time.monotonic() - due)
            due += interval

    sampler = asyncio.create_task(sample())
    await asyncio.gather(*(one(p, s) for p, s in zip(producers, sessions, strict=True)))
    elapsed = time.monotonic() - started
    cpu = {
        name: round((tree_cpu_s(pid) - cpu_before[name]) / elapsed, 3)
        for name, pid in stack.pids().items()
    }
    await asyncio.gather(*(p.flush() for p in producers))
    sampler.cancel()
    sent = sum(p.next_sequence for p in producers)
    durable = sum(p.durable for p in producers)
    reconnects = sum(p.reconnects for p in producers)
    await asyncio.gather(*(p.close() for p in producers))
    return {
        "sessions": sessions,
        "sent": sent,
        "durable": durable,
        "reconnects": reconnects,
        "connected_s": round(connected_s, 1),
        "load_s": round(elapsed, 1),
        "cores_busy": cpu,
        "api_rss_kib": memory,
    }


def delivery_check(stack: Stack, sessions: list[Session], durable: int) -> dict[str, Any]:
    """Every acknowledged message called once, in order within its group."""
    arrivals: dict[str, list[float]] = orjson.loads(webhook_get(stack.webhook_port, "dump"))
    missing = repeated = out_of_order = 0
    for session in sessions:
        last = 0.0
        for sequence in range(session.point):
            seen = arrivals.get(f"{session.producer_id}:{sequence}")
            if seen is None:
                missing += 1
                continue
            repeated += int(seen[1]) - 1
            if seen[0] < last:
                out_of_order += 1
            last = seen[0]
    return {
        "acknowledged": durable,
        "missing": missing,
        "repeated": repeated,
        "out_of_order": out_of_order,
    }


def figures_of(args: argparse.Namespace, run: dict[str, Any]) -> dict[str, Any]:
    sessions: list[Session] = run["sessions"]
    everything = sorted(x for s in sessions for x in s.latencies)
    per_session_p99 = sorted(percentile(sorted(s.latencies), 0.99) for s in sessions if s.latencies)
    limit_s = args.starved_ms / 1000
    starved = [
        s.producer_id
        for s in sessions
        if s.worst_lag_s > limit_s
        or not s.latencies
        or percentile(sorted(s.latencies), 0.99) > limit_s
    ]
    memory = run["api_rss_kib"]
    first = [kib for at, kib in memory if at <= 60]
    last = [kib for at, kib in memory if at >= memory[-1][0] - 60] if memory else []
    api_cores = run["cores_busy"].get("api", 0.0)
    messages_per_s = run["durable"] / run["load_s"] if run["load_s"] else 0.0
    return {
        "sent": run["sent"],
        "durable": run["durable"],
        "reconnects": run["reconnects"],
        "connected_s": run["connected_s"],
        "load_s": run["load_s"],
        "messages_per_s": round(messages_per_s, 1),
        "ack_ms": {
            "p50": round(percentile(everything, 0.5) * 1000, 1) if everything else None,
            "p99": round(percentile(everything, 0.99) * 1000, 1) if everything else None,
            "max": round(everything[-1] * 1000, 1) if everything else None,
            "worst_session_p99": round(per_session_p99[-1] * 1000, 1) if per_session_p99 else None,
        },
        "worst_send_lag_ms": round(max(s.worst_lag_s for s in sessions) * 1000, 1),
        "starved_sessions": len(starved),
        "starved_examples": starved[:10],
        "api_rss_mib": {
            "first": round(memory[0][1] / 1024, 1) if memory else None,
            "last": round(memory[-1][1] / 1024, 1) if memory else None,
            "highest": round(max(k for _, k in memory) / 1024, 1) if memory else None,
            "first_minute_median": round(statistics.median(first) / 1024, 1) if first else None,
            "last_minute_median": round(statistics.median(last) / 1024, 1) if last else None,
        },
        "api_rss_samples_kib": memory,
        "cores_busy": run["cores_busy"],
        "api_cpu_us_per_message": round(1e6 * api_cores / messages_per_s, 1)
        if messages_per_s
        else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    service_arguments(parser)
    stack_arguments(parser)
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--rate-each", type=float, default=2.0, help="messages/s per session")
    parser.add_argument("--seconds", type=float, default=300.0)
    parser.add_argument("--keys", type=int, default=8, help="producer keys the sessions share")
    parser.add_argument(
        "--starved-ms",
        type=float,
        default=1000.0,
        help="a session whose ACK p99 or send lag exceeds this counts as starved",
    )
    args = parser.parse_args(argv)
    quiet_client_logs()
    stream_port = any_free_port()
    env = {"SETU_STREAM_PORT": str(stream_port)}
    with stack_running(args, env=env, prefix="setu-sessions-") as stack:
        set_up(stack, timeout_s=180)
        keys = producer_keys(stack, args.keys)
        before = int(webhook_get(stack.webhook_port, "count"))
        run = asyncio.run(run_sessions(args, stack, keys, stream_port))
        wait_delivered(stack, before + run["durable"], timeout_s=180)
        delivered = delivery_check(stack, run["sessions"], run["durable"])
    figures = figures_of(args, run)
    figures["delivered"] = delivered
    checks = {
        "every_message_durable": figures["durable"] == figures["sent"],
        "every_message_delivered_once_in_order": delivered["missing"] == 0
        and delivered["repeated"] == 0
        and delivered["out_of_order"] == 0,
        "no_session_starved": figures["starved_sessions"] == 0,
    }
    print(
        orjson.dumps(
            {k: v for k, v in figures.items() if k != "api_rss_samples_kib"},
            option=orjson.OPT_INDENT_2,
        ).decode()
    )
    for name, passed in checks.items():
        print(f"  {'PASS' if passed else 'MISS'}  {name}")
    settings = {k: v for k, v in vars(args).items()}
    out = write_result(
        "stream-sessions",
        {"settings": settings, "figures": figures, "targets": checks},
        f"-{args.label}" if args.label else "",
    )
    print(f"written {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
