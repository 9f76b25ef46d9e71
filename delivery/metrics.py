"""Prometheus metrics of one delivery worker, in a registry of its own, served by the worker
on ``SETU_DELIVERY_METRICS_PORT`` (off when unset).

Counters, labelled by ``project`` and ``subscription`` (bounded: one series per subscription
and label value below):

- ``setu_delivery_calls_total{result}``: webhook calls by verdict (``delivered``, ``retry``,
  ``dead_letter``), and ``setu_delivery_call_duration_seconds``: how long they took.
- Latency histograms (docs/latency.md): ``setu_delivery_ingest_seconds`` (produced, as the
  API stamped it, to its main-log record's timestamp: the ingest job's part; a record the
  job wrote again after a restart counts again, late), ``setu_delivery_main_wait_seconds``
  (a main-log record's timestamp to the worker reading it), ``setu_delivery_dispatch_seconds``
  (read to its first call sent: the wait behind its group and for a free call slot) and
  ``setu_delivery_end_to_end_seconds`` (produced, as the API stamped it, to the 2xx).
- ``setu_delivery_moves_total{tier, kind}``: copies written to a retry tier or the DLQ, by
  why (``head``, ``park``, ``forward``, ``skip``, ``retry``, ``dead``, ``lap``).
- ``setu_delivery_refused_calls_total``: calls refused before anything was sent (a host that
  resolves to an address webhooks may not reach, docs/security.md §4, or an unsafe request);
  they are dead-lettered with the reason.
- ``setu_delivery_filtered_total``: main-log messages the subscription's filter turned away,
  never called (docs/policies.md §1).
- ``setu_delivery_unscheduled_total{why}``: scheduled messages finished without a call
  (``cancelled`` by their producer, ``gone`` from the main log; docs/scheduling.md).
- ``setu_delivery_breaker_opened_total``: times the circuit breaker opened, and
  ``setu_delivery_breaker_given_back_total``: failed calls made while it was open, whose
  attempt was not counted (docs/policies.md §2).
- ``setu_delivery_events_total{result}`` (no subscription label): operational events sent to
  projects' notification endpoints, calls that failed, events dropped, events no endpoint
  wanted (delivery/events.py).
- ``setu_delivery_reparked_total``: released dead letters that failed for good and parked
  their group again.
- ``setu_delivery_stale_copies_total``: copies of a worker that had lost the partition,
  skipped (see :mod:`setu.ordering.fencing`).
- ``setu_delivery_attempt_log_dropped_total``: attempt-log entries dropped because Redis
  did not take them for long (delivery/attempts.py).
- ``setu_delivery_runner_failures_total{error}``: runners that gave up and were restarted,
  by error class (``Fenced`` when a stalled worker was fenced out, ``StateLost`` when Redis
  no longer held what the worker wrote).
- ``setu_delivery_state_rebuilds_total``: partitions whose group state a takeover found
  missing from Redis, or older there, and rebuilt from the changelog (docs/design.md §4).

Gauges, read from the live runners at scrape time (nothing on the hot path):
``setu_delivery_partitions``, ``setu_delivery_in_flight``, ``setu_delivery_buffered_records``,
``setu_delivery_retry_backlog``, ``setu_delivery_parked_messages``,
``setu_delivery_breaker_state{state}`` (1 for the breaker's state on this worker: ``closed``,
``open`` or ``half_open``), ``setu_delivery_oldest_held_age_seconds`` (the oldest
message a group holds unfinished, since it was produced), ``setu_delivery_failed_groups{state}``
(``retrying`` or ``dead_lettered``) of the partitions this worker owns,
``setu_delivery_oldest_failed_group_age_seconds{state}`` and
``setu_delivery_failed_messages_retention_seconds{state}`` (the subscription's longest-unhealthy
group against the retention of the topics holding its messages: docs/design.md §4).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from delivery.breaker import BreakerState, BreakerView
from delivery.events import EventCounts
from setu.metrics import LATENCY_BUCKETS, Buckets, serve
from setu.ordering.records import Record
from setu.outcome import Outcome, Verdict

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
    # When the oldest message a group holds unfinished in memory was produced (ms).
    oldest_held_ms: int | None = None
    # Messages parked in the DLQ behind their failed groups (the DLQ's live depth).
    parked: int = 0
    # Groups whose head waits for the time its producer chose (docs/scheduling.md).
    scheduled_groups: int = 0
    breaker: str = "closed"
    # Per standing (retrying, dead_lettered): when the subscription's longest-unhealthy group
    # first failed (ms), and the retention of the topics holding its messages (None: for ever).
    oldest_failed_ms: dict[str, int] = field(default_factory=dict)
    retention_ms: dict[str, int | None] = field(default_factory=dict)


class SubscriptionMetrics:
    """The counters of one subscription: plain numbers bumped on the event loop (a call costs
    a few hundred nanoseconds, not a lock per metric), turned into samples at scrape time."""

    def __init__(self, project: str, subscription: str) -> None:
        self.labels = [project, subscription]
        self.calls = {"delivered": 0, "retry": 0, "dead_letter": 0}
        self.call_seconds = Buckets(CALL_BUCKETS)
        self.ingest_seconds = Buckets(LATENCY_BUCKETS)
        self.main_wait_seconds = Buckets(LATENCY_BUCKETS)
        self.dispatch_seconds = Buckets(LATENCY_BUCKETS)
        self.end_to_end_seconds = Buckets(LATENCY_BUCKETS)
        self.moves: dict[tuple[str, str], int] = {}
        self.reparked_total = 0
        self.refused_total = 0
        self.attempt_log_dropped_total = 0
        self.stale_total = 0
        self.filtered_total = 0
        # Scheduled messages finished without a call, by why: cancelled, gone.
        self.unscheduled_total: dict[str, int] = {}
        self.breaker_opened_total = 0
        self.given_back_total = 0
        self.failures: dict[str, int] = {}
        self.rebuilds_total = 0

    def call(self, outcome: Outcome, seconds: float) -> None:
        self.calls[outcome.verdict.value] += 1
        if outcome.given_back:
            self.given_back_total += 1
        self.call_seconds.observe(seconds)
        if outcome.refused:
            self.refused_total += 1

    def timed(
        self, record: Record, attempt: int, outcome: Outcome, seconds: float, now: int
    ) -> None:
        """The latency figures of one call ended at ``now`` (ms) after ``seconds``."""
        if attempt == 1 and record.kind is None and record.read_ms:
            started = now - seconds * 1000
            self.dispatch_seconds.observe(max(0.0, started - record.read_ms) / 1000)
        produced = record.envelope.produced_at_ms
        if outcome.verdict is Verdict.DELIVERED and produced:
            self.end_to_end_seconds.observe(max(0, now - produced) / 1000)

    def attempt_log_dropped(self, n: int) -> None:
        self.attempt_log_dropped_total += n

    def moved(self, tier: str, kind: str, n: int) -> None:
        key = (tier, kind)
        self.moves[key] = self.moves.get(key, 0) + n

    def reparked(self) -> None:
        self.reparked_total += 1

    def stale_copies(self, n: int) -> None:
        self.stale_total += n

    def filtered(self) -> None:
        self.filtered_total += 1

    def unscheduled(self, why: str) -> None:
        self.unscheduled_total[why] = self.unscheduled_total.get(why, 0) + 1

    def breaker_changed(self, view: BreakerView) -> None:
        if view.state is BreakerState.OPEN:
            self.breaker_opened_total += 1

    def rebuilt(self, partitions: int) -> None:
        self.rebuilds_total += partitions

    def failed(self, error: BaseException) -> None:
        name = type(error).__name__
        self.failures[name] = self.failures.get(name, 0) + 1


class _Totals(Collector):
    """The subscriptions' counters as samples."""

    def __init__(self, subscriptions: Callable[[], list[SubscriptionMetrics]]) -> None:
        self._subscriptions = subscriptions

    def collect(self) -> Iterator[Metric]:
        labels = ["project", "subscription"]
        calls = CounterMetricFamily(
            "setu_delivery_calls",
            "Webhook calls by verdict (delivered, retry, dead_letter).",
            labels=[*labels, "result"],
        )
        seconds = HistogramMetricFamily(
            "setu_delivery_call_duration_seconds",
            "Webhook call duration, to the answer or the error.",
            labels=labels,
        )
        latencies = [
            HistogramMetricFamily(
                "setu_delivery_ingest_seconds",
                "From a message's produce to its main-log record's timestamp (the ingest job).",
                labels=labels,
            ),
            HistogramMetricFamily(
                "setu_delivery_main_wait_seconds",
                "From a main-log record's timestamp to the worker reading it.",
                labels=labels,
            ),
            HistogramMetricFamily(
                "setu_delivery_dispatch_seconds",
                "From a main-log record read to its first call sent.",
                labels=labels,
            ),
            HistogramMetricFamily(
                "setu_delivery_end_to_end_seconds",
                "From a message's produce to its webhook's 2xx.",
                labels=labels,
            ),
        ]
        moves = CounterMetricFamily(
            "setu_delivery_moves",
            "Copies written to a retry tier or the DLQ, by tier and why.",
            labels=[*labels, "tier", "kind"],
        )
        refused = CounterMetricFamily(
            "setu_delivery_refused_calls",
            "Webhook calls refused before anything was sent (SSRF rule or unsafe request).",
            labels=labels,
        )
        reparked = CounterMetricFamily(
            "setu_delivery_reparked",
            "Released dead letters that failed for good and parked their group again.",
            labels=labels,
        )
        stale = CounterMetricFamily(
            "setu_delivery_stale_copies",
            "Copies of a worker that had lost the partition, skipped.",
            labels=labels,
        )
        filtered = CounterMetricFamily(
            "setu_delivery_filtered",
            "Main-log messages the subscription's filter turned away, never called.",
            labels=labels,
        )
        unscheduled = CounterMetricFamily(
            "setu_delivery_unscheduled",
            "Scheduled messages finished without a call: cancelled by their producer, or gone "
            "from the main log.",
            labels=[*labels, "why"],
        )
        opened = CounterMetricFamily(
            "setu_delivery_breaker_opened",
            "Times the subscription's circuit breaker opened.",
            labels=labels,
        )
        given_back = CounterMetricFamily(
            "setu_delivery_breaker_given_back",
            "Failed calls made while the circuit breaker was open; their attempt was not counted.",
            labels=labels,
        )
        dropped = CounterMetricFamily(
            "setu_delivery_attempt_log_dropped",
            "Attempt-log entries dropped because Redis did not take them.",
            labels=labels,
        )
        failures = CounterMetricFamily(
            "setu_delivery_runner_failures",
            "Subscription runners that gave up (and were restarted), by error class.",
            labels=[*labels, "error"],
        )
        rebuilds = CounterMetricFamily(
            "setu_delivery_state_rebuilds",
            "Partitions whose group state Redis had lost, rebuilt from the changelog.",
            labels=labels,
        )
        for sub in self._subscriptions():
            key = sub.labels
            rebuilds.add_metric(key, sub.rebuilds_total)
            for verdict, n in list(sub.calls.items()):
                calls.add_metric([*key, verdict], n)
            seconds.add_metric(key, sub.call_seconds.cumulative(), sub.call_seconds.sum)
            timings = (
                sub.ingest_seconds,
                sub.main_wait_seconds,
                sub.dispatch_seconds,
                sub.end_to_end_seconds,
            )
            for family, buckets in zip(latencies, timings, strict=True):
                family.add_metric(key, buckets.cumulative(), buckets.sum)
            for (tier, kind), n in list(sub.moves.items()):
                moves.add_metric([*key, tier, kind], n)
            refused.add_metric(key, sub.refused_total)
            reparked.add_metric(key, sub.reparked_total)
            stale.add_metric(key, sub.stale_total)
            filtered.add_metric(key, sub.filtered_total)
            for why, n in list(sub.unscheduled_total.items()):
                unscheduled.add_metric([*key, why], n)
            opened.add_metric(key, sub.breaker_opened_total)
            given_back.add_metric(key, sub.given_back_total)
            dropped.add_metric(key, sub.attempt_log_dropped_total)
            for error, n in list(sub.failures.items()):
                failures.add_metric([*key, error], n)
        yield from (calls, seconds, moves, refused, reparked, stale, filtered, unscheduled)
        yield from (opened, given_back, dropped, failures, rebuilds, *latencies)


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
            "scheduled": GaugeMetricFamily(
                "setu_delivery_scheduled_groups",
                "Groups whose head waits for the time its producer chose, on this worker's "
                "partitions (not failed; docs/scheduling.md).",
                labels=labels,
            ),
            "parked": GaugeMetricFamily(
                "setu_delivery_parked_messages",
                "Messages parked in the DLQ behind their failed groups, on this worker's "
                "partitions (the DLQ's live depth under the park policy).",
                labels=labels,
            ),
            "oldest": GaugeMetricFamily(
                "setu_delivery_oldest_held_age_seconds",
                "Age (since produced) of the oldest message a group holds unfinished on this "
                "worker: a head retrying, or the messages waiting behind it.",
                labels=labels,
            ),
        }
        now = time.time()
        groups = GaugeMetricFamily(
            "setu_delivery_failed_groups",
            "Failed groups on the partitions this worker owns, by state.",
            labels=[*labels, "state"],
        )
        failed_age = GaugeMetricFamily(
            "setu_delivery_oldest_failed_group_age_seconds",
            "Since the subscription's longest-unhealthy group first failed, by state: none of "
            "its messages in a retry tier or the DLQ is older.",
            labels=[*labels, "state"],
        )
        retention = GaugeMetricFamily(
            "setu_delivery_failed_messages_retention_seconds",
            "How long the retry tiers (retrying) or the DLQ (dead_lettered) keep messages; "
            "absent when for ever. An oldest failed group older than this has lost messages.",
            labels=[*labels, "state"],
        )
        breaker = GaugeMetricFamily(
            "setu_delivery_breaker_state",
            "1 for the circuit breaker's state on this worker (closed, open, half_open).",
            labels=[*labels, "state"],
        )
        for f in self._figures():
            key = [f.project, f.subscription]
            for state in BreakerState:
                breaker.add_metric([*key, state.value], float(f.breaker == state.value))
            gauges["partitions"].add_metric(key, f.partitions)
            gauges["in_flight"].add_metric(key, f.in_flight)
            gauges["buffered"].add_metric(key, f.buffered)
            gauges["retry_backlog"].add_metric(key, f.retry_backlog)
            gauges["parked"].add_metric(key, f.parked)
            gauges["scheduled"].add_metric(key, f.scheduled_groups)
            if f.oldest_held_ms is not None:
                gauges["oldest"].add_metric(key, max(0.0, now - f.oldest_held_ms / 1000))
            for standing, at in f.oldest_failed_ms.items():
                failed_age.add_metric([*key, standing], max(0.0, now - at / 1000))
            for standing, ms in f.retention_ms.items():
                if ms is not None:
                    retention.add_metric([*key, standing], ms / 1000)
            groups.add_metric([*key, "retrying"], f.retrying_groups)
            groups.add_metric([*key, "dead_lettered"], f.dead_lettered_groups)
        yield from gauges.values()
        yield groups
        yield breaker
        yield failed_age
        yield retention


class _Events(Collector):
    """What the worker's notifier did with operational events (delivery/events.py)."""

    def __init__(self, counts: EventCounts) -> None:
        self._counts = counts

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "setu_delivery_events",
            "Operational events by what became of them: sent, failed (a call that failed; "
            "tried again), dropped (given up), skipped (no endpoint wanted them).",
            labels=["result"],
        )
        for result in ("sent", "failed", "dropped", "skipped"):
            family.add_metric([result], getattr(self._counts, result))
        yield family


class _Commits(Collector):
    """The worker's commits waiting for their turn (delivery/pace.py)."""

    def __init__(self, waiting: Callable[[], int]) -> None:
        self._waiting = waiting

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "setu_delivery_commits_waiting",
            "Offset commits of this worker's subscriptions waiting for their turn: the worker "
            "starts at most SETU_DELIVERY_COMMITS_PER_SECOND a second.",
            value=self._waiting(),
        )


class DeliveryMetrics:
    """The worker's registry (see the module doc)."""

    def __init__(self, figures: Callable[[], Iterable[RunnerFigures]] = tuple) -> None:
        self.registry = CollectorRegistry()
        self._subscriptions: dict[tuple[str, str], SubscriptionMetrics] = {}
        self._figures = figures
        self.events = EventCounts()
        ProcessCollector(registry=self.registry)
        self.registry.register(_Events(self.events))
        self.registry.register(_Totals(lambda: list(self._subscriptions.values())))
        self.registry.register(_Live(lambda: self._figures()))

    def watch(self, figures: Callable[[], Iterable[RunnerFigures]]) -> None:
        """Where the live gauges come from (the worker's runners)."""
        self._figures = figures

    def watch_commits(self, waiting: Callable[[], int]) -> None:
        """Where the count of commits waiting for their turn comes from."""
        self.registry.register(_Commits(waiting))

    def subscription(self, project: str, subscription: str) -> SubscriptionMetrics:
        """The subscription's counters; the same ones for every runner it gets, so they only
        grow across restarts."""
        key = (project, subscription)
        found = self._subscriptions.get(key)
        if found is None:
            found = self._subscriptions[key] = SubscriptionMetrics(project, subscription)
        return found

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def serve(self, host: str, port: int) -> Any:
        """Serves ``GET /metrics`` on a thread of its own; returns the server (``shutdown()``)."""
        return serve(self.registry, host, port)
