"""Prometheus metrics of one delivery worker, in a registry of its own, served by the worker
on ``SETU_DELIVERY_METRICS_PORT`` (off when unset).

Counters, labelled by ``project`` and ``subscription`` (bounded: one series per subscription
and label value below):

- ``setu_delivery_calls_total{result}``: webhook calls by verdict (``delivered``, ``retry``,
  ``dead_letter``), and ``setu_delivery_call_duration_seconds``: how long they took.
- ``setu_delivery_moves_total{tier, kind}``: copies written to a retry tier or the DLQ, by
  why (``head``, ``park``, ``forward``, ``skip``, ``retry``, ``dead``, ``lap``).
- ``setu_delivery_reparked_total``: released dead letters that failed for good and parked
  their group again.
- ``setu_delivery_stale_copies_total``: copies of a worker that had lost the partition,
  skipped (see :mod:`delivery.fencing`).
- ``setu_delivery_runner_failures_total{error}``: runners that gave up and were restarted,
  by error class (``Fenced`` when a stalled worker was fenced out).

Gauges, read from the live runners at scrape time (nothing on the hot path):
``setu_delivery_partitions``, ``setu_delivery_in_flight``, ``setu_delivery_buffered_records``,
``setu_delivery_retry_backlog``, ``setu_delivery_failed_groups{state}`` (``retrying`` or
``dead_lettered``) of the partitions this worker owns.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    ProcessCollector,
    generate_latest,
    start_http_server,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from delivery.outcome import Outcome

CALL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


@dataclass(frozen=True, slots=True)
class RunnerFigures:
    """What one runner reports at scrape time."""

    project: str
    subscription: str
    partitions: int
    in_flight: int
    buffered: int
    retry_backlog: int
    retrying_groups: int
    dead_lettered_groups: int


class SubscriptionMetrics:
    """The counters of one subscription, with their labelled children resolved once."""

    def __init__(self, metrics: DeliveryMetrics, project: str, subscription: str) -> None:
        self._metrics = metrics
        self._labels = (project, subscription)
        self._calls = {
            verdict: metrics.calls.labels(project, subscription, verdict)
            for verdict in ("delivered", "retry", "dead_letter")
        }
        self._seconds = metrics.call_seconds.labels(project, subscription)
        self._moves: dict[tuple[str, str], Any] = {}
        self._reparked = metrics.reparked.labels(project, subscription)
        self._stale = metrics.stale_copies.labels(project, subscription)

    def call(self, outcome: Outcome, seconds: float) -> None:
        self._calls[outcome.verdict.value].inc()
        self._seconds.observe(seconds)

    def moved(self, tier: str, kind: str, n: int) -> None:
        child = self._moves.get((tier, kind))
        if child is None:
            child = self._moves[(tier, kind)] = self._metrics.moves.labels(
                *self._labels, tier, kind
            )
        child.inc(n)

    def reparked(self) -> None:
        self._reparked.inc()

    def stale_copies(self, n: int) -> None:
        self._stale.inc(n)

    def failed(self, error: BaseException) -> None:
        self._metrics.runner_failures.labels(*self._labels, type(error).__name__).inc()


class _Live(Collector):
    """Gauges computed from the live runners when Prometheus scrapes."""

    def __init__(self, figures: Callable[[], Iterable[RunnerFigures]]) -> None:
        self._figures = figures

    def collect(self) -> Iterator[GaugeMetricFamily]:
        labels = ["project", "subscription"]
        gauges = {
            "partitions": GaugeMetricFamily(
                "setu_delivery_partitions", "Partition indices this worker owns.", labels=labels
            ),
            "in_flight": GaugeMetricFamily(
                "setu_delivery_in_flight", "Webhook calls in progress.", labels=labels
            ),
            "buffered": GaugeMetricFamily(
                "setu_delivery_buffered_records",
                "Records read and not yet finished (in memory).",
                labels=labels,
            ),
            "retry_backlog": GaugeMetricFamily(
                "setu_delivery_retry_backlog",
                "Messages of failed groups waiting in retry tiers.",
                labels=labels,
            ),
        }
        groups = GaugeMetricFamily(
            "setu_delivery_failed_groups",
            "Failed groups on the partitions this worker owns, by state.",
            labels=[*labels, "state"],
        )
        for f in self._figures():
            key = [f.project, f.subscription]
            gauges["partitions"].add_metric(key, f.partitions)
            gauges["in_flight"].add_metric(key, f.in_flight)
            gauges["buffered"].add_metric(key, f.buffered)
            gauges["retry_backlog"].add_metric(key, f.retry_backlog)
            groups.add_metric([*key, "retrying"], f.retrying_groups)
            groups.add_metric([*key, "dead_lettered"], f.dead_lettered_groups)
        yield from gauges.values()
        yield groups


class DeliveryMetrics:
    """The worker's registry (see the module doc)."""

    def __init__(self, figures: Callable[[], Iterable[RunnerFigures]] = tuple) -> None:
        self.registry = CollectorRegistry()
        labels = ["project", "subscription"]
        self.calls = Counter(
            "setu_delivery_calls",
            "Webhook calls by verdict (delivered, retry, dead_letter).",
            [*labels, "result"],
            registry=self.registry,
        )
        self.call_seconds = Histogram(
            "setu_delivery_call_duration_seconds",
            "Webhook call duration, to the answer or the error.",
            labels,
            buckets=CALL_BUCKETS,
            registry=self.registry,
        )
        self.moves = Counter(
            "setu_delivery_moves",
            "Copies written to a retry tier or the DLQ, by tier and why.",
            [*labels, "tier", "kind"],
            registry=self.registry,
        )
        self.reparked = Counter(
            "setu_delivery_reparked",
            "Released dead letters that failed for good and parked their group again.",
            labels,
            registry=self.registry,
        )
        self.stale_copies = Counter(
            "setu_delivery_stale_copies",
            "Copies of a worker that had lost the partition, skipped.",
            labels,
            registry=self.registry,
        )
        self.runner_failures = Counter(
            "setu_delivery_runner_failures",
            "Subscription runners that gave up (and were restarted), by error class.",
            [*labels, "error"],
            registry=self.registry,
        )
        ProcessCollector(registry=self.registry)
        self._figures = figures
        self.registry.register(_Live(lambda: self._figures()))

    def watch(self, figures: Callable[[], Iterable[RunnerFigures]]) -> None:
        """Where the live gauges come from (the worker's runners)."""
        self._figures = figures

    def subscription(self, project: str, subscription: str) -> SubscriptionMetrics:
        return SubscriptionMetrics(self, project, subscription)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def serve(self, host: str, port: int) -> Any:
        """Serves ``GET /metrics`` on a thread of its own; returns the server (``shutdown()``)."""
        server, _ = start_http_server(port, addr=host, registry=self.registry)
        return server
