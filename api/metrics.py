"""Prometheus metrics of the API, in a registry of their own (one per app, so tests can build
many apps), served at ``GET /metrics``.

- ``setu_api_requests_total{method, route, status}`` and
  ``setu_api_request_duration_seconds{method, route}``: every HTTP request, labelled by route
  template (``/v1/projects/{project}/topics/{topic}/produce``), so label values stay bounded.
- ``setu_api_produced_messages_total{project, topic, outcome}``: messages produced, by outcome
  (``ok``, ``rejected`` for 4xx, ``failed`` for Kafka errors). ``/metrics`` needs no key, so
  the project and topic are empty (one series per outcome) unless ``tenant_labels``
  (``SETU_METRICS_TENANT_LABELS``) says that only the scraper reaches it (docs/security.md §2).
- ``setu_api_produce_ack_seconds{kind}``: from the Kafka write to its acknowledgement, per
  single message or per batch.
- ``setu_api_producer_queue_records``: records enqueued and not yet acknowledged.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    generate_latest,
)
from starlette.types import ASGIApp, Message, Receive, Scope, Send

# Set by middleware that answers a request before routing, for the route label.
ROUTE_KEY = "setu.route"
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
UNMATCHED_ROUTE = "unmatched"


class ApiMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self, tenant_labels: bool = False) -> None:
        self.tenant_labels = tenant_labels
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "setu_api_requests",
            "HTTP requests by route template and status.",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self.request_seconds = Histogram(
            "setu_api_request_duration_seconds",
            "HTTP request duration by route template.",
            ["method", "route"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.produced = Counter(
            "setu_api_produced_messages",
            "Messages produced, by outcome (ok, rejected, throttled, failed, duplicate).",
            ["project", "topic", "outcome"],
            registry=self.registry,
        )
        self.produce_ack_seconds = Histogram(
            "setu_api_produce_ack_seconds",
            "From the Kafka write to the broker's acknowledgement.",
            ["kind"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.quota_unchecked = Counter(
            "setu_api_quota_checks_failed",
            "Produce requests admitted without a quota check because Redis did not answer.",
            registry=self.registry,
        )
        self.producer_queue = Gauge(
            "setu_api_producer_queue_records",
            "Records enqueued in the Kafka producer and not yet acknowledged.",
            registry=self.registry,
        )
        self.stream_sessions = Gauge(
            "setu_api_stream_sessions",
            "Streaming produce sessions open (docs/streaming.md).",
            registry=self.registry,
        )
        self.stream_session_ends = Counter(
            "setu_api_stream_session_ends",
            "Streaming produce sessions ended, by how (closed, error, idle, refused, restart).",
            ["how"],
            registry=self.registry,
        )
        self.stream_buffered_bytes = Gauge(
            "setu_api_stream_buffered_bytes",
            "Bytes of streamed messages written and not yet acknowledged by Kafka.",
            registry=self.registry,
        )
        ProcessCollector(registry=self.registry)
        # Labelled children by label values: labels() takes a lock and builds tuples on every
        # call, which shows on the produce path.
        self._request_children: dict[tuple[str, str, int], tuple[Any, Any]] = {}
        self._produced_children: dict[tuple[str, str, str], Any] = {}
        self._ack_children: dict[str, Any] = {}

    def watch_producer_queue(self, length: Callable[[], int]) -> None:
        self.producer_queue.set_function(length)

    def observe_request(self, method: str, route: str, status: int, seconds: float) -> None:
        key = (method, route, status)
        children = self._request_children.get(key)
        if children is None:
            children = (
                self.requests.labels(method, route, str(status)),
                self.request_seconds.labels(method, route),
            )
            self._request_children[key] = children
        children[0].inc()
        children[1].observe(seconds)

    def count_produced(self, project: str, topic: str, outcome: str, amount: int = 1) -> None:
        if not self.tenant_labels:
            project = topic = ""  # an empty label is no label to Prometheus
        key = (project, topic, outcome)
        child = self._produced_children.get(key)
        if child is None:
            child = self._produced_children[key] = self.produced.labels(project, topic, outcome)
        child.inc(amount)

    def count_unchecked_quota(self) -> None:
        self.quota_unchecked.inc()

    def observe_ack(self, kind: str, seconds: float) -> None:
        child = self._ack_children.get(kind)
        if child is None:
            child = self._ack_children[kind] = self.produce_ack_seconds.labels(kind)
        child.observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)


def route_template(scope: Scope) -> str:
    """The matched route's path template, or ``unmatched`` for unknown paths."""
    if ROUTE_KEY in scope:
        return str(scope[ROUTE_KEY])
    route = scope.get("route")
    path = getattr(route, "path", None)
    return path if isinstance(path, str) else UNMATCHED_ROUTE


class MetricsMiddleware:
    """Counts and times every HTTP request (a plain ASGI middleware: cheap on the hot path)."""

    def __init__(self, app: ASGIApp, metrics: ApiMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def send_and_record_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_record_status)
        finally:
            seconds = time.perf_counter() - started
            self.metrics.observe_request(scope["method"], route_template(scope), status, seconds)
