"""One tenant's burst against everyone else's latency, on the real stack.

    python -m bench.burst [--bootstrap ...] [--redis ...] [--bursts quota,none]
                          [--burst-messages 941] [--burst-seconds 10] [--rate 20]

Two projects share Setu's processes (``setu api``, ``setu ingest``, one ``setu deliver``, as
``bench.latency`` runs them): the *steady* project produces small messages at ``--rate`` for
the whole run, and the *bursting* project, with one producer key, sends ``--burst-messages``
compressible messages of the largest accepted size within ``--burst-seconds`` (0.92 GiB
uncompressed, a few MB on Kafka's disk: the shape that once stopped ingest for every project),
retrying each refused one after its ``Retry-After`` as a real producer would. Both projects
have a grouped subscription to one webhook.

First a baseline window with no burst, then one burst per entry of ``--bursts``:

- ``quota``: the bursting project has no quota of its own, so the default one applies
  (``SETU_PRODUCE_QUOTA_BYTES_PER_SECOND``, as the run's settings give it);
- ``none``: the bursting project's byte quota is lifted to the largest allowed (100 GiB/s).

For each window: the steady project's end-to-end latency (scheduled POST -> webhook call),
how long the burst took to be accepted and delivered, how many of its produces were refused
(429), whether the ingest job stayed up, and the peak memory of the ingest job's processes.
Figures are printed and written under bench/results/.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import threading
import time
import uuid
from typing import Any

import httpx
import orjson

from bench.latency import (
    PARTITIONS,
    Phase,
    Sent,
    Stack,
    run_load,
    stack_arguments,
    stack_running,
    stats_ms,
    warm_up,
    webhook_get,
)
from bench.machine import (
    machine,
    process_tree,
    quiet_client_logs,
    service_arguments,
    write_result,
)
from setu.limits import DEFAULT_MAX_MESSAGE_BYTES

BASELINE_S = 30.0
# After a burst is delivered, the steady load goes on this long before the next window.
SETTLE_S = 15.0
WINDOW_LIMIT_S = 300.0
BURST_CONNECTIONS = 8
# The largest byte quota a project may have (api/schemas.py): "none" in effect.
UNLIMITED_BYTES_PER_S = 100 * 2**30
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


def tree_rss_bytes(pid: int) -> int:
    """Resident memory of a process and all its descendants."""
    return sum(int(fields[21]) * PAGE_BYTES for fields in process_tree(pid).values())


class PeakMemory:
    """Samples a process tree's RSS every half second in a thread; ``take()`` answers the
    peak since the last take."""

    def __init__(self, pid: int) -> None:
        self._pid = pid
        self._peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            self._peak = max(self._peak, tree_rss_bytes(self._pid))

    def take(self) -> int:
        peak, self._peak = self._peak, 0
        return peak

    def stop(self) -> None:
        self._stop.set()


def make_projects(stack: Stack, burster: str) -> dict[str, str]:
    base = f"http://127.0.0.1:{stack.api_port}"
    admin = {"Authorization": f"Bearer {stack.admin_key}"}
    hook = f"http://127.0.0.1:{stack.webhook_port}/hook"
    with httpx.Client(base_url=base, headers=admin, timeout=30) as client:
        for project, topic in ((stack.project, "orders"), (burster, "bulk")):
            for path, body in [
                ("/v1/projects", {"name": project}),
                (
                    f"/v1/projects/{project}/topics",
                    {"name": topic, "grouped": True, "partitions": PARTITIONS},
                ),
                (
                    f"/v1/projects/{project}/subscriptions",
                    {"name": "hook", "topic": topic, "grouped": True, "endpoint": {"url": hook}},
                ),
            ]:
                answer = client.post(path, json=body)
                if answer.status_code not in (200, 201):
                    raise SystemExit(f"POST {path}: {answer.status_code} {answer.text}")
        answer = client.post(
            f"/v1/projects/{burster}/keys", json={"name": "bulk", "role": "producer"}
        )
        if answer.status_code != 201:
            raise SystemExit(f"key: {answer.status_code} {answer.text}")
        return {
            "p": stack.project,
            "t": "orders",
            "auth": admin["Authorization"],
            "burst_key": answer.json()["key"],
        }


def set_quota(stack: Stack, project: str, bytes_per_second: float | None) -> None:
    base = f"http://127.0.0.1:{stack.api_port}"
    admin = {"Authorization": f"Bearer {stack.admin_key}"}
    answer = httpx.put(
        f"{base}/v1/projects/{project}/quota",
        json={"bytes_per_second": bytes_per_second},
        headers=admin,
        timeout=30,
    )
    if answer.status_code != 200:
        raise SystemExit(f"quota: {answer.status_code} {answer.text}")


async def burst(
    stack: Stack, project: str, key: str, name: str, messages: int, seconds: float
) -> dict[str, Any]:
    """Sends the burst on schedule over a few connections, each refused message again after
    its Retry-After; answers when the last was accepted and how many refusals it took."""
    body = b"x" * (DEFAULT_MAX_MESSAGE_BYTES - 1024)
    path = f"/v1/projects/{project}/topics/bulk/produce"
    started = time.monotonic()
    refused = failed = 0
    queue: asyncio.Queue[int] = asyncio.Queue()

    async def feed() -> None:
        for n in range(messages):
            delay = started + n * seconds / messages - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            queue.put_nowait(n)

    async def sender(client: httpx.AsyncClient) -> None:
        nonlocal refused, failed
        while True:
            n = await queue.get()
            headers = {"X_MESSAGE_ID": f"{name}-{n}", "X_GROUP_ID": f"{name}-g{n % 50}"}
            while True:
                try:
                    answer = await client.post(path, content=body, headers=headers)
                except httpx.TransportError:
                    failed += 1
                    await asyncio.sleep(0.5)
                    continue
                if answer.status_code // 100 == 2:
                    break
                if answer.status_code == 429:
                    refused += 1
                    await asyncio.sleep(float(answer.headers.get("retry-after", "1")))
                    continue
                failed += 1
                await asyncio.sleep(0.5)
            queue.task_done()

    auth = {"Authorization": f"Bearer {key}"}
    base = f"http://127.0.0.1:{stack.api_port}"
    async with httpx.AsyncClient(base_url=base, headers=auth, timeout=60) as client:
        senders = [asyncio.create_task(sender(client)) for _ in range(BURST_CONNECTIONS)]
        await feed()
        await queue.join()
        for task in senders:
            task.cancel()
    return {
        "messages": messages,
        "bytes": messages * len(body),
        "accepted_in_s": round(time.monotonic() - started, 1),
        "refused_429": refused,
        "failed_other": failed,
    }


def arrivals(stack: Stack) -> dict[str, list[float]]:
    parsed: dict[str, list[float]] = orjson.loads(webhook_get(stack.webhook_port, "dump"))
    return parsed


async def run(
    args: argparse.Namespace, stack: Stack, ids: dict[str, str], burster: str
) -> dict[str, Any]:
    windows: list[tuple[str, float, float]] = []  # (name, wall start, wall end)
    figures: dict[str, dict[str, Any]] = {}
    memory = PeakMemory(stack.processes["ingest"].pid)
    total_s = BASELINE_S + len(args.bursts) * (WINDOW_LIMIT_S + SETTLE_S)
    sent: dict[str, Sent] = {}
    phase = Phase("steady", args.rate, dedup=False)
    load = asyncio.create_task(run_load(stack.api_port, phase, total_s, 0.0, ids, sent))
    try:
        began = time.time()
        await asyncio.sleep(BASELINE_S)
        windows.append(("baseline", began, time.time()))
        figures["baseline"] = {"ingest_peak_rss_mb": memory.take() // 2**20}
        for mode in args.bursts:
            if mode == "none":
                set_quota(stack, burster, UNLIMITED_BYTES_PER_S)
            name = f"burst-{mode}"
            print(f"{name}: {args.burst_messages} messages within {args.burst_seconds:.0f} s")
            began = time.time()
            window = await burst(
                stack, burster, ids["burst_key"], name, args.burst_messages, args.burst_seconds
            )
            window.update(await delivered(stack, name, args.burst_messages, began))
            await asyncio.sleep(SETTLE_S)
            windows.append((name, began, time.time()))
            window["ingest_peak_rss_mb"] = memory.take() // 2**20
            figures[name] = window
            print(f"  {window}", flush=True)
    finally:
        load.cancel()
        memory.stop()
    got = arrivals(stack)
    for name, start, end in windows:
        due = [(key, record) for key, record in sent.items() if start <= record.due < end]
        latencies = [got[key][0] - record.due for key, record in due if key in got]
        figures[name]["steady_end_to_end_ms"] = stats_ms(latencies)
        figures[name]["steady_undelivered"] = len(due) - len(latencies)
    return figures


async def delivered(stack: Stack, name: str, messages: int, began: float) -> dict[str, Any]:
    """Waits until the burst reached the webhook (or the ingest job died, or the window's
    limit passed) and says how it went."""
    deadline = time.monotonic() + WINDOW_LIMIT_S
    count = 0
    while time.monotonic() < deadline and stack.processes["ingest"].poll() is None:
        count = sum(1 for key in arrivals(stack) if key.startswith(f"{name}-"))
        if count >= messages:
            break
        await asyncio.sleep(1.0)
    return {
        "delivered": count,
        "delivered_in_s": round(time.time() - began, 1),
        "ingest_alive": stack.processes["ingest"].poll() is None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    service_arguments(parser)
    parser.add_argument("--bursts", default="quota,none", type=lambda s: s.split(","))
    parser.add_argument("--burst-messages", type=int, default=941)
    parser.add_argument("--burst-seconds", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=20.0, help="the steady project's msg/s")
    stack_arguments(parser)
    args = parser.parse_args(argv)
    quiet_client_logs()
    run_id = uuid.uuid4().hex[:8]
    steady, burster = f"bu{run_id}-steady", f"bu{run_id}-bulk"
    pattern = {"SETU_SPARK_INGEST_PATTERN": f"^setu\\.bu{run_id}-[a-z]+\\.[a-z0-9-]+\\.ingest$"}
    with stack_running(args, steady, pattern, prefix="setu-burst-") as stack:
        ids = make_projects(stack, burster)
        base = f"http://127.0.0.1:{stack.api_port}"
        auth = {"Authorization": ids["auth"]}
        with httpx.Client(base_url=base, headers=auth, timeout=30) as client:
            warm_up(stack, client, f"/v1/projects/{ids['p']}/topics/{ids['t']}/produce", 180.0)
        figures = asyncio.run(run(args, stack, ids, burster))
    result = {
        "machine": machine(),
        "settings": stack.extra_env,
        "burst": {"messages": args.burst_messages, "seconds": args.burst_seconds},
        "steady_rate": args.rate,
        "windows": figures,
    }
    print(json.dumps(result, indent=2))
    print(f"written to {write_result('burst', result)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
