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
