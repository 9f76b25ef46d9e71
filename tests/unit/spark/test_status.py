"""The ingest job's report: what the API and `setu dev up` read (state.ingest_status)."""

from __future__ import annotations

from spark.status import StatusReporter
from state.ingest_status import StubIngestStatus


def test_a_failure_stays_shown_until_a_batch_is_written_after_it() -> None:
    # Given a job that wrote a batch, then failed and started its query again
    store = StubIngestStatus()
    last_batch: list[float | None] = [100.0]
    reporter = StatusReporter(store, lambda: last_batch[0])
    reporter.watch(lambda: (True, None))
    reporter.set_state("failed", error="TimeoutException: broker away")
    reporter.set_state("starting")
    # When heartbeats go by without a new batch, then the failure is still shown
    reporter.beat()
    status = store.read()
    assert (status["state"], status.get("error")) == ("running", "TimeoutException: broker away")
    # When a batch is written after the failure, then it is cleared
    last_batch[0] = 200.0
    reporter.beat()
    assert "error" not in store.read()
    assert store.read()["last_batch"] == "200000"


def test_a_failure_from_before_this_process_is_cleared_by_its_first_batch() -> None:
    store = StubIngestStatus()
    store.write({"state": "failed", "error": "earlier"})
    last_batch: list[float | None] = [None]
    reporter = StatusReporter(store, lambda: last_batch[0])
    reporter.watch(lambda: (True, None))
    reporter.set_state("starting")
    reporter.beat()
    assert store.read()["error"] == "earlier"
    last_batch[0] = 5.0
    reporter.beat()
    assert "error" not in store.read()


def progress_of(*topics: str) -> dict[str, object]:
    """A progress report whose source read ``topics`` (one partition each, 3 records behind)."""
    latest = {t: {"0": 10} for t in topics}
    ends = {t: {"0": 7} for t in topics}
    return {"sources": [{"latestOffset": latest, "endOffset": ends}]}


def test_the_topics_the_running_query_reads_are_reported() -> None:
    # Given a running query whose last progress read topic a
    store = StubIngestStatus()
    reporter = StatusReporter(store, lambda: None)
    reporter.set_state("starting")
    reporter.watch(lambda: (True, progress_of("setu.p.a.ingest")))
    reporter.beat()
    # Then the report names it, beside its lag
    assert store.read()["reading"] == '["setu.p.a.ingest"]'
    assert store.read()["lags"] == '{"setu.p.a.ingest": 3}'
    # When the job says what its query reads itself (real-time mode: progress comes only at a
    # batch's end, and a query started again for topic b has none yet)
    reporter.watch(lambda: (True, None), lambda: {"setu.p.b.ingest", "setu.p.a.ingest"})
    reporter.beat()
    # Then that is reported
    assert store.read()["reading"] == '["setu.p.a.ingest", "setu.p.b.ingest"]'
