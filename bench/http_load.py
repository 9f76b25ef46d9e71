"""A lean HTTP/1.1 load generator for the produce benchmark.

Keep-alive connections speaking just enough HTTP/1.1 (no pipelining), so the client costs far
less CPU than the server it measures: on a two-core machine an httpx client would be the
bottleneck. Two shapes of load:

- closed loop: each connection sends its next request as soon as the previous one answered;
  gives the saturation throughput for that many concurrent clients;
- open loop: each connection sends on a fixed schedule (together ``rate`` per second) and a
  request's latency counts from its scheduled time, so a stall is not hidden by the senders
  slowing down (no coordinated omission).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

RequestFactory = Callable[[int, int], bytes]
"""(connection index, request number) -> the raw request bytes"""


@dataclass
class LoadResult:
    seconds: float
    latencies_s: list[float] = field(default_factory=list)
    statuses: dict[int, int] = field(default_factory=dict)
    # perf_counter of the first measured request's start and the last one's end.
    first_start: float = 0.0
    last_end: float = 0.0
    # Every request sent, warm-up included (for CPU per request over the whole phase).
    sent: int = 0

    def record(self, started: float, status: int) -> None:
        ended = time.perf_counter()
        if not self.latencies_s:
            self.first_start = started
        self.latencies_s.append(ended - started)
        self.statuses[status] = self.statuses.get(status, 0) + 1
        self.last_end = max(self.last_end, ended)

    @property
    def achieved_per_s(self) -> float:
        """Completed requests over the time they actually took (an overloaded open loop
        finishes late, so this is less than the offered rate)."""
        span = max(self.last_end - self.first_start, self.seconds)
        return self.completed / span if span > 0 else 0.0

    @property
    def completed(self) -> int:
        return len(self.latencies_s)

    @property
    def ok(self) -> int:
        return sum(n for status, n in self.statuses.items() if 200 <= status < 300)

    def summary(self) -> dict[str, float | int | dict[str, int]]:
        ordered = sorted(self.latencies_s)
        return {
            "requests": self.completed,
            "ok": self.ok,
            "statuses": {str(s): n for s, n in sorted(self.statuses.items())},
            "seconds": round(self.seconds, 3),
            "requests_per_s": round(self.achieved_per_s, 1),
            "p50_ms": round(percentile(ordered, 0.50) * 1000, 2),
            "p90_ms": round(percentile(ordered, 0.90) * 1000, 2),
            "p99_ms": round(percentile(ordered, 0.99) * 1000, 2),
            "max_ms": round((ordered[-1] if ordered else 0.0) * 1000, 2),
        }


def percentile(ordered: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list (0.0 when empty)."""
    if not ordered:
        return 0.0
    rank = max(1, round(q * len(ordered) + 0.5))
    return ordered[min(rank, len(ordered)) - 1]


class Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(cls, host: str, port: int) -> Connection:
        reader, writer = await asyncio.open_connection(host, port)
        return cls(reader, writer)

    async def send(self, request: bytes) -> tuple[int, bytes]:
        """Sends one request and reads its response; returns status and body."""
        self.writer.write(request)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        length = 0
        for line in head.lower().split(b"\r\n"):
            if line.startswith(b"content-length:"):
                length = int(line[15:])
        body = await self.reader.readexactly(length) if length else b""
        return status, body

    def close(self) -> None:
        self.writer.close()


def request_bytes(method: str, path: str, headers: dict[str, str], body: bytes) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: setu", f"Content-Length: {len(body)}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


async def closed_loop(
    host: str,
    port: int,
    make: RequestFactory,
    *,
    connections: int,
    duration_s: float,
    warmup_s: float,
) -> LoadResult:
    """Saturating load; only requests that start after the warm-up are measured."""
    start = time.perf_counter()
    measure_from = start + warmup_s
    stop_at = measure_from + duration_s
    result = LoadResult(seconds=duration_s)

    async def run(index: int) -> None:
        conn = await Connection.open(host, port)
        n = 0
        try:
            while (began := time.perf_counter()) < stop_at:
                status, _ = await conn.send(make(index, n))
                n += 1
                result.sent += 1
                if began >= measure_from:
                    result.record(began, status)
        finally:
            conn.close()

    await asyncio.gather(*(run(i) for i in range(connections)))
    return result


async def open_loop(
    host: str,
    port: int,
    make: RequestFactory,
    *,
    rate_per_s: float,
    connections: int,
    duration_s: float,
    warmup_s: float,
) -> LoadResult:
    """``rate_per_s`` requests a second spread over ``connections``; latency from schedule."""
    interval = connections / rate_per_s
    start = time.perf_counter() + 0.1
    measure_from = start + warmup_s
    stop_at = measure_from + duration_s
    result = LoadResult(seconds=duration_s)

    async def run(index: int) -> None:
        conn = await Connection.open(host, port)
        n = 0
        try:
            while (due := start + index * interval / connections + n * interval) < stop_at:
                delay = due - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                status, _ = await conn.send(make(index, n))
                n += 1
                result.sent += 1
                if due >= measure_from:
                    result.record(due, status)
        finally:
            conn.close()

    await asyncio.gather(*(run(i) for i in range(connections)))
    return result
