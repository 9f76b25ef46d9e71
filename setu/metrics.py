"""Prometheus pieces the delivery worker and the ingest job share.

Their counters are plain numbers bumped by one thread (a bump costs a few hundred nanoseconds,
not a lock per metric) and turned into samples by a collector at scrape time.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server

# Bounds (s) of the latency histograms: fine around the targets of docs/latency.md (0.4 s at
# 200 msg/s, 1 s at 1,000), so that quantiles read from them are close.
LATENCY_BUCKETS = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    1.5,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
)


class Buckets:
    """A histogram with fixed bounds, as plain numbers."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # the last one is +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    def merge(self, counts: Sequence[int], total: float) -> None:
        """Adds counts per bound (+Inf last) and their sum, as :meth:`observe` would have."""
        for i, n in enumerate(counts):
            self.counts[i] += n
        self.sum += total

    def cumulative(self) -> list[tuple[str, float]]:
        """(le, how many values were at most le) per bound, +Inf last: what
        ``HistogramMetricFamily`` takes as buckets."""
        out, running = [], 0
        for bound, n in zip([*map(str, self.bounds), "+Inf"], list(self.counts), strict=True):
            running += n
            out.append((bound, float(running)))
        return out


def serve(registry: CollectorRegistry, host: str, port: int) -> Any:
    """Serves ``GET /metrics`` on a thread of its own; returns the server (``shutdown()``)."""
    server, _ = start_http_server(port, addr=host, registry=registry)
    return server
