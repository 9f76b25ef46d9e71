"""Load for streaming produce (docs/streaming.md) with ``setu.client``: saturation throughput
and acknowledgement latency at a set rate, over several streams at once."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from bench.http_load import percentile
from setu.client import AsyncStreamProducer


@dataclass
class StreamRun:
    """What one phase measured over all its streams."""

    sent: int = 0
    durable: int = 0
    seconds: float = 0.0
    # Every message the phase sent, warm-up included: what a CPU meter around the whole phase
    # paid for.
    sent_in_all: int = 0
    # Seconds from each message's scheduled send to the ACK that covered it (paced runs).
    latencies: list[float] = field(default_factory=list)

    def summary(self) -> dict[str, float | int]:
        ordered = sorted(self.latencies)
        out: dict[str, float | int] = {
            "sent": self.sent,
            "durable": self.durable,
            "seconds": round(self.seconds, 3),
            "messages_per_s": round(self.durable / self.seconds, 1) if self.seconds else 0.0,
        }
        if ordered:
            out.update(
                p50_ms=round(percentile(ordered, 0.5) * 1000, 2),
                p99_ms=round(percentile(ordered, 0.99) * 1000, 2),
                max_ms=round(ordered[-1] * 1000, 2),
            )
        return out


class _Timed:
    """Scheduled send times of one stream, turned into latencies as ACK points pass them."""

    def __init__(self, run: StreamRun) -> None:
        self.run = run
        self.scheduled: dict[int, float] = {}
        self.point = 0

    def durable(self, point: int) -> None:
        now = time.perf_counter()
        for sequence in range(self.point, point):
            at = self.scheduled.pop(sequence, None)
            if at is not None:
                self.run.latencies.append(now - at)
        self.point = max(self.point, point)


async def stream_load(
    address: str,
    key: str,
    project: str,
    topic: str,
    body: bytes,
    groups: int,
    *,
    streams: int,
    duration_s: float,
    rate_per_s: float | None = None,
    warmup_s: float = 2.0,
) -> StreamRun:
    """``streams`` producers send ``body`` over ``groups`` groups for ``warmup_s`` +
    ``duration_s``: as fast as credits allow, or open loop at ``rate_per_s`` in all. Counted:
    the messages sent after the warm-up and acknowledged by the end of the flush."""
    run = StreamRun()
    timers = [_Timed(run) for _ in range(streams)]
    producers = [
        AsyncStreamProducer(
            address,
            key,
            project,
            topic,
            f"bench-{time.time_ns()}-{n}",
            program="bench.produce",
            on_durable=timers[n].durable,
        )
        for n in range(streams)
    ]
    for producer in producers:
        await producer.start()
    loop = asyncio.get_running_loop()
    began = loop.time()
    measured_from = began + warmup_s
    ends = measured_from + duration_s
    first_measured = [0] * streams

    async def one(n: int) -> None:
        producer, timer = producers[n], timers[n]
        interval = streams / rate_per_s if rate_per_s else 0.0
        next_at = loop.time()
        sequence = 0
        while True:
            now = loop.time()
            if now >= ends:
                return
            if interval:
                if next_at > now:
                    await asyncio.sleep(next_at - now)
                scheduled = next_at
                next_at += interval
            else:
                scheduled = now
            if scheduled >= measured_from:
                if not first_measured[n]:
                    first_measured[n] = sequence
                # perf_counter time of the scheduled send: an open loop counts waiting too
                timer.scheduled[sequence] = time.perf_counter() - (loop.time() - scheduled)
            await producer.send(body, group_id=f"g{(n + sequence * streams) % groups}")
            sequence += 1

    await asyncio.gather(*(one(n) for n in range(streams)))
    await asyncio.gather(*(p.flush() for p in producers))
    run.seconds = loop.time() - measured_from
    for n, producer in enumerate(producers):
        run.sent_in_all += producer.next_sequence
        run.sent += producer.next_sequence - first_measured[n]
        run.durable += producer.durable - first_measured[n]
    await asyncio.gather(*(p.close() for p in producers))
    return run
