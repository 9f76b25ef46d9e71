"""The ingest job's Prometheus metrics: what a scrape shows after batches are written."""

from __future__ import annotations

import urllib.request
from typing import Any

from spark.metrics import IngestMetrics, offsets_behind
from tests.unit.spark.scrapes import labels, samples


def progress(*behind: str | None) -> dict[str, Any]:
    sources = [{"metrics": {} if b is None else {"maxOffsetsBehindLatest": b}} for b in behind]
    return {"batchId": 3, "sources": sources}


def test_written_batches_are_counted_per_topic_and_timed() -> None:
    # Given the job's metrics
    metrics = IngestMetrics()
    # When two batches are written
    metrics.batch_written({"setu.shop.orders.ingest": (10, 2)}, 0.3)
    metrics.batch_written(
        {"setu.shop.orders.ingest": (5, 0), "setu.shop.refunds.ingest": (1, 1)}, 4
    )
    # Then a scrape shows messages by topic and verdict, batches and their durations
    got = samples(metrics)
    messages = "setu_ingest_messages_total"
    assert got[(messages, labels(project="shop", topic="orders", result="accepted"))] == 15
    assert got[(messages, labels(project="shop", topic="orders", result="duplicate"))] == 2
    assert got[(messages, labels(project="shop", topic="refunds", result="duplicate"))] == 1
    assert got[("setu_ingest_batches_total", ())] == 2
    assert got[("setu_ingest_batch_seconds_bucket", (("le", "0.5"),))] == 1
    assert got[("setu_ingest_batch_seconds_bucket", (("le", "5.0"),))] == 2
    assert got[("setu_ingest_batch_seconds_count", ())] == 2
    assert got[("setu_ingest_batch_seconds_sum", ())] == 4.3
    assert got[("setu_ingest_last_batch_timestamp_seconds", ())] > 0


def test_scrape_reads_the_query_state_and_how_far_it_has_to_read() -> None:
    # Given metrics watching a query that is active and trails by 120 records at most
    metrics = IngestMetrics()
    metrics.watch(lambda: (True, progress("7", "120")))
    got = samples(metrics)
    assert got[("setu_ingest_query_active", ())] == 1
    assert got[("setu_ingest_offsets_behind_latest", ())] == 120
    # When the query has stopped before any progress
    metrics.watch(lambda: (False, None))
    got = samples(metrics)
    # Then it shows as inactive, with no lag figure, and nothing written yet
    assert got[("setu_ingest_query_active", ())] == 0
    assert not any(name == "setu_ingest_offsets_behind_latest" for name, _ in got)
    assert not any(name == "setu_ingest_last_batch_timestamp_seconds" for name, _ in got)


def test_a_query_that_cannot_be_asked_shows_as_inactive() -> None:
    # Given metrics watching a query whose JVM has gone away
    def gone() -> tuple[bool, None]:
        raise EOFError

    metrics = IngestMetrics()
    metrics.watch(gone)
    # Then a scrape still answers, with the query inactive
    assert samples(metrics)[("setu_ingest_query_active", ())] == 0


def test_lag_is_the_largest_over_sources_that_report_it() -> None:
    assert offsets_behind(progress(None, "3", "9.0")) == 9
    assert offsets_behind(progress(None)) is None
    assert offsets_behind({}) is None


def test_metrics_are_served_over_http() -> None:
    # Given metrics served on a free port
    metrics = IngestMetrics()
    metrics.batch_written({"setu.p.t.ingest": (1, 0)}, 0.1)
    server = metrics.serve("127.0.0.1", 0)
    try:
        # When Prometheus scrapes them
        url = f"http://127.0.0.1:{server.server_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            body = response.read().decode()
    finally:
        server.shutdown()
    # Then the counters are there
    assert 'setu_ingest_messages_total{project="p",result="accepted",topic="t"} 1.0' in body
