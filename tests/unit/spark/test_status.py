"""The ingest job's report: what the API and `setu dev up` read (state.ingest_status)."""

from __future__ import annotations

from spark.status import StatusReporter
from state import keys


class FakeRedis:
    """The two hash commands the reporter uses, on a dict."""

    def __init__(self) -> None:
        self.hashes: dict[str, dict[str, str | int]] = {}

    def hset(self, key: str, mapping: dict[str, str | int]) -> None:
        self.hashes.setdefault(key, {}).update(mapping)

    def hdel(self, key: str, *fields: str) -> None:
        for field in fields:
            self.hashes.get(key, {}).pop(field, None)


def test_a_failure_stays_shown_until_a_batch_is_written_after_it() -> None:
    # Given a job that wrote a batch, then failed and started its query again
    client = FakeRedis()
    last_batch: list[float | None] = [100.0]
    reporter = StatusReporter(client, lambda: last_batch[0])  # type: ignore[arg-type]
    reporter.watch(lambda: (True, None))
    reporter.set_state("failed", error="TimeoutException: broker away")
    reporter.set_state("starting")
    status = client.hashes[keys.ingest_status()]
    # When heartbeats go by without a new batch, then the failure is still shown
    reporter.beat()
    assert (status["state"], status.get("error")) == ("running", "TimeoutException: broker away")
    # When a batch is written after the failure, then it is cleared
    last_batch[0] = 200.0
    reporter.beat()
    assert "error" not in status
    assert status["last_batch"] == 200_000


def test_a_failure_from_before_this_process_is_cleared_by_its_first_batch() -> None:
    client = FakeRedis()
    client.hset(keys.ingest_status(), mapping={"state": "failed", "error": "earlier"})
    last_batch: list[float | None] = [None]
    reporter = StatusReporter(client, lambda: last_batch[0])  # type: ignore[arg-type]
    reporter.watch(lambda: (True, None))
    reporter.set_state("starting")
    reporter.beat()
    assert client.hashes[keys.ingest_status()]["error"] == "earlier"
    last_batch[0] = 5.0
    reporter.beat()
    assert "error" not in client.hashes[keys.ingest_status()]
