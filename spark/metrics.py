"""Prometheus metrics of the ingest job, in a registry of its own, served by ``setu ingest`` on
``SETU_INGEST_METRICS_PORT`` (off when unset).

Counted as the operator decides (read from the executors every second,
:class:`spark.operator_job.CountsFollower`; a stretch replayed after a crash counts again):

- ``setu_ingest_messages_total{project, topic, result}``: messages the de-duplication step
  kept (``accepted``) or dropped (``duplicate``).

Counted as each batch ends (in real-time mode a batch is a checkpoint interval, not a wait):

- ``setu_ingest_batches_total``: batches committed, and ``setu_ingest_batch_seconds``: how long
  each took (a histogram).
- ``setu_ingest_last_batch_timestamp_seconds``: when the last batch was written.
- ``setu_ingest_main_topics_recreated_total``: main topics found missing and created again
  (:mod:`spark.topics`).

Read from the query at scrape time:

- ``setu_ingest_query_active``: 1 while the query runs.
- ``setu_ingest_offsets_behind_latest``: after the last batch, how far the furthest-behind
  ingest partition's read position trailed its end offset (the Kafka source's
  ``maxOffsetsBehindLatest``): how much the job has still to read.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from setu.metrics import LATENCY_BUCKETS, Buckets, serve
from setu.names import parse_ingest_topic

BATCH_BUCKETS = LATENCY_BUCKETS

TopicCounts = dict[str, tuple[int, int]]
"""Ingest topic -> (messages accepted, duplicates dropped)."""


def add_counts(into: TopicCounts, other: Mapping[str, tuple[int, int]]) -> TopicCounts:
    """Adds ``other`` to ``into``, in place."""
    for topic, (accepted, duplicates) in other.items():
        was_accepted, was_duplicates = into.get(topic, (0, 0))
        into[topic] = (was_accepted + accepted, was_duplicates + duplicates)
    return into


Progress = Callable[[], "tuple[bool, Mapping[str, Any] | None]"]
"""Whether the query is active, and its last progress report (None before the first)."""


@dataclass
class _Totals:
    counts: TopicCounts = field(default_factory=dict)
    batches: int = 0
    batch_seconds: Buckets = field(default_factory=lambda: Buckets(BATCH_BUCKETS))
    last_batch_at: float | None = None
    recreated: int = 0


class IngestMetrics(Collector):
    """The job's registry (see the module doc), and the collector of its samples."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._totals = _Totals()
        self._progress: Progress = lambda: (False, None)
        self._rejects: Callable[[], Mapping[str, int]] = dict
        ProcessCollector(registry=self.registry)
        self.registry.register(self)

    def watch(self, progress: Progress) -> None:
        """Where the scrape-time gauges come from (the running query)."""
        self._progress = progress

    def batch_written(self, counts: Mapping[str, tuple[int, int]], seconds: float) -> None:
        totals = self._totals
        add_counts(totals.counts, counts)
        totals.batches += 1
        totals.batch_seconds.observe(seconds)
        totals.last_batch_at = time.time()

    def records_decided(self, counts: Mapping[str, tuple[int, int]]) -> None:
        """Adds records kept and dropped per ingest topic, between batch ends (the operator's
        modes, :class:`spark.operator_job.CountsFollower`)."""
        add_counts(self._totals.counts, counts)

    def topics_seen(self) -> frozenset[str]:
        """The ingest topics whose records this process decided on."""
        return frozenset(self._totals.counts.copy())  # copy(): atomic beside the counting thread

    def batches(self) -> int:
        """Batches this process wrote."""
        return self._totals.batches

    def last_batch_at(self) -> float | None:
        """When this process last wrote a batch (Unix time), None before its first."""
        return self._totals.last_batch_at

    def main_topic_recreated(self, topic: str) -> None:
        self._totals.recreated += 1

    def watch_rejects(self, rejects: Callable[[], Mapping[str, int]]) -> None:
        """Where the records held in the ingest reject topics come from (spark.topics)."""
        self._rejects = rejects

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def serve(self, host: str, port: int) -> Any:
        """Serves ``GET /metrics`` on a thread of its own; returns the server (``shutdown()``)."""
        return serve(self.registry, host, port)

    def collect(self) -> Iterator[Metric]:
        totals = self._totals
        messages = CounterMetricFamily(
            "setu_ingest_messages",
            "Messages the de-duplication step kept or dropped, once their batch is written",
            labels=["project", "topic", "result"],
        )
        for ingest_topic, (accepted, duplicates) in sorted(totals.counts.items()):
            project, topic = _labels(ingest_topic)
            messages.add_metric([project, topic, "accepted"], accepted)
            messages.add_metric([project, topic, "duplicate"], duplicates)
        yield messages
        yield CounterMetricFamily(
            "setu_ingest_batches", "Batches written to the main logs", value=totals.batches
        )
        yield HistogramMetricFamily(
            "setu_ingest_batch_seconds",
            "Time to de-duplicate and write one batch",
            buckets=totals.batch_seconds.cumulative(),
            sum_value=totals.batch_seconds.sum,
        )
        yield CounterMetricFamily(
            "setu_ingest_main_topics_recreated",
            "Main topics found missing while their ingest topic exists, and created again",
            value=totals.recreated,
        )
        rejected = GaugeMetricFamily(
            "setu_ingest_rejected_records",
            "Records set aside in a topic's ingest reject topic (spark.rejects) and still held",
            labels=["project", "topic"],
        )
        for ingest_topic, held in sorted(self._rejects().items()):
            rejected.add_metric(list(_labels(ingest_topic)), held)
        yield rejected
        if totals.last_batch_at is not None:
            yield GaugeMetricFamily(
                "setu_ingest_last_batch_timestamp_seconds",
                "When the last batch was written (Unix time)",
                value=totals.last_batch_at,
            )
        try:
            active, progress = self._progress()
        except Exception:  # the JVM is going away (a scrape during shutdown)
            active, progress = False, None
        yield GaugeMetricFamily(
            "setu_ingest_query_active", "1 while the ingest query runs", value=int(active)
        )
        behind = offsets_behind(progress)
        if behind is not None:
            yield GaugeMetricFamily(
                "setu_ingest_offsets_behind_latest",
                "After the last batch: most records any ingest partition had still to be read",
                value=behind,
            )


def offsets_behind(progress: Mapping[str, Any] | None) -> float | None:
    """The largest ``maxOffsetsBehindLatest`` over the sources of a progress report."""
    if not progress:
        return None
    found: list[float] = []
    for source in progress.get("sources") or ():
        value = (source.get("metrics") or {}).get("maxOffsetsBehindLatest")
        if value is not None:
            found.append(float(value))
    return max(found, default=None)


def _labels(ingest_topic: str) -> tuple[str, str]:
    try:
        return parse_ingest_topic(ingest_topic)
    except ValueError:
        return "", ingest_topic
