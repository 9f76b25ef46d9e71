"""The driver's side of the operator's modes (spark/operator_job.py): when a take-over starts
again, when the query must start again, and the Spark properties of real-time mode."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from setu.errors import DependencyUnavailable
from setu.settings import Settings
from spark.metrics import IngestMetrics
from spark.operator_job import (
    BatchFollower,
    CountsFollower,
    QueryInputs,
    has_committed,
    session_overrides,
    until_kafka_answers,
)
from tests.unit.spark.scrapes import labels, samples


def batch(checkpoint: Path, number: int, committed: bool) -> None:
    (checkpoint / "offsets").mkdir(parents=True, exist_ok=True)
    (checkpoint / "commits").mkdir(exist_ok=True)
    (checkpoint / "offsets" / str(number)).write_text('v1\n{}\n{"t":{"0":5}}')
    if committed:
        (checkpoint / "commits" / str(number)).write_text("v1\n{}")


def test_a_checkpoint_that_committed_a_batch_is_resumed(tmp_path: Path) -> None:
    checkpoint = tmp_path / "operator"
    batch(checkpoint, 0, committed=True)
    batch(checkpoint, 1, committed=False)
    assert has_committed(str(checkpoint))
    assert (checkpoint / "offsets" / "1").exists()


def test_a_checkpoint_that_committed_nothing_is_removed_for_a_new_take_over(
    tmp_path: Path,
) -> None:
    # Given a query that started (its first batch planned) and was stopped before its commit
    checkpoint = tmp_path / "operator"
    batch(checkpoint, 0, committed=False)
    # Then the take-over starts again, from nothing
    assert not has_committed(str(checkpoint))
    assert not checkpoint.exists()
    # And a checkpoint never made is no committed one either
    assert not has_committed(str(tmp_path / "never"))


def test_the_query_starts_again_when_retired_topics_or_limits_change() -> None:
    retired: set[str] = set()
    limits = {"setu.p.t": 1_000_000}
    inputs = QueryInputs(
        Settings(ingest_mode="micro-batch"),
        r"^setu\.p\.[a-z0-9-]+\.ingest$",
        lambda: dict(limits),
        lambda: set(retired),
    )
    inputs.take()
    assert not inputs.changed()
    limits["setu.p.t"] = 2_000_000
    assert inputs.changed()
    inputs.take()  # started again
    assert not inputs.changed()
    retired.add("setu.p.t.ingest")
    assert inputs.changed()
    inputs.take()
    # But a topic the query does not read (another job's, say) retired or reopened does not
    # start it again: a query started again writes its running batch a second time, and a
    # flapping list restarted it every second
    retired.add("setu.other.t.ingest")
    assert not inputs.changed()
    retired.discard("setu.other.t.ingest")
    assert not inputs.changed()


def test_real_time_mode_asks_a_local_master_for_its_slots_and_a_short_shuffle_wait() -> None:
    realtime = Settings(ingest_mode="real-time", spark_realtime_slots=40)
    conf = session_overrides(realtime)
    assert conf["spark.master"] == "local[40]"
    # (and twice what the ingest partitions there are need, when that is more: 30 partitions
    # and 2 shuffle partitions)
    assert session_overrides(realtime, partitions=30)["spark.master"] == "local[64]"
    assert conf["spark.shuffle.streaming.networkBufferMaxWaitTimeMs"] == "5"
    # (the running tasks' counts reach the metrics with each heartbeat)
    assert conf["spark.executor.heartbeatInterval"] == "2s"
    # (a cluster's master is the operator's to size)
    on_cluster = Settings(ingest_mode="real-time", spark_master="spark://m:7077")
    assert "spark.master" not in session_overrides(on_cluster)
    assert session_overrides(Settings(ingest_mode="micro-batch")) == {}


class Live:
    """What ``setu.ingest.LiveCounts.encoded()`` answers through py4j: a line
    ``"<topic> <kept> <dropped>"`` per topic (``TopicCountsTest`` holds the JVM side to it)."""

    def __init__(self) -> None:
        self.counts: dict[str, list[int]] = {}

    def encoded(self) -> str:
        return "".join(f"{t} {n[0]} {n[1]}\n" for t, n in self.counts.items())


def test_the_counts_follower_adds_what_grew_and_never_counts_down() -> None:
    # Given the job's metrics and the operator's live counts
    metrics = IngestMetrics()
    live = Live()
    follower = CountsFollower(live, metrics)
    messages = "setu_ingest_messages_total"
    orders = labels(project="shop", topic="orders", result="accepted")
    dropped = labels(project="shop", topic="orders", result="duplicate")
    # When a running task has decided 10 records, then 15 (a heartbeat each)
    live.counts = {"setu.shop.orders.ingest": [10, 1]}
    follower.catch_up()
    live.counts = {"setu.shop.orders.ingest": [15, 1]}
    follower.catch_up()
    # Then the metrics count them as they come, each once
    assert samples(metrics)[(messages, orders)] == 15
    assert samples(metrics)[(messages, dropped)] == 1
    # When the task fails (its counts leave the totals) and its records are decided again
    live.counts = {"setu.shop.orders.ingest": [3, 0]}
    follower.catch_up()
    assert samples(metrics)[(messages, orders)] == 15
    live.counts = {"setu.shop.orders.ingest": [18, 2]}
    follower.catch_up()
    # Then the counter never went down, and goes on from the highest seen
    assert samples(metrics)[(messages, orders)] == 18
    assert samples(metrics)[(messages, dropped)] == 2


def test_the_job_waits_for_kafka_to_answer_at_its_start_instead_of_exiting() -> None:
    # A regression: a broker restarting as the job started made it exit (its topics' admin
    # request unanswered); the 100-subscription crash runs counted it as a fault every time
    tries: list[int] = []

    def make_topics() -> None:
        tries.append(1)
        if len(tries) < 3:
            raise DependencyUnavailable("Kafka did not answer the admin request in time")

    until_kafka_answers(make_topics, threading.Event(), pause_s=lambda n: 0.01)
    assert len(tries) == 3


def test_the_job_gives_up_on_kafka_after_its_patience_or_when_asked_to_stop() -> None:
    def away() -> None:
        raise DependencyUnavailable("Kafka did not answer the admin request in time")

    with pytest.raises(DependencyUnavailable):
        until_kafka_answers(away, threading.Event(), patience_s=0.05, pause_s=lambda n: 0.01)
    stopping = threading.Event()
    stopping.set()
    with pytest.raises(DependencyUnavailable):
        until_kafka_answers(away, stopping, pause_s=lambda n: 60)


def test_a_real_time_batch_shorter_than_spark_allows_is_refused_with_the_setting_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Spark refuses batches under 5 s: the job failed at every start instead
    monkeypatch.setenv("SETU_SPARK_REALTIME_BATCH_S", "2")
    with pytest.raises(ValidationError, match="spark_realtime_batch_s"):
        Settings()
    monkeypatch.setenv("SETU_SPARK_REALTIME_BATCH_S", "5")
    assert Settings().spark_realtime_batch_s == 5


class Progressing:
    """A query as the batch follower sees it: its last and recent progress (Spark keeps the
    run's recent ones, oldest first)."""

    def __init__(self) -> None:
        self.recentProgress: list[dict[str, Any]] = []

    @property
    def lastProgress(self) -> dict[str, Any] | None:  # noqa: N802
        return self.recentProgress[-1] if self.recentProgress else None

    def ran(self, batch_id: int, ms: int) -> None:
        durations = {"addBatch": ms - 10, "walCommit": 5, "triggerExecution": ms}
        self.recentProgress.append({"batchId": batch_id, "durationMs": durations})

    def idled(self, next_id: int) -> None:
        durations = {"latestOffset": 1, "triggerExecution": 1}
        self.recentProgress.append({"batchId": next_id, "durationMs": durations})


def batches_seen(metrics: IngestMetrics) -> tuple[float, float]:
    scrape = samples(metrics)
    return scrape[("setu_ingest_batches_total", ())], scrape[("setu_ingest_batch_seconds_sum", ())]


def test_the_batch_follower_counts_each_ended_batch_once_and_never_an_idle_update() -> None:
    metrics = IngestMetrics()
    follower = BatchFollower(metrics)
    query = Progressing()
    follower.follow(query)  # type: ignore[arg-type]
    # A query that has not ended a batch yet: nothing
    follower.catch_up()
    assert batches_seen(metrics) == (0, 0)
    # One batch ended, looked at twice: counted once, with its duration
    query.ran(0, 1000)
    follower.catch_up()
    follower.catch_up()
    assert batches_seen(metrics) == (1, 1.0)
    # The query idles: its updates name the next batch, which has not run
    query.idled(1)
    follower.catch_up()
    query.idled(1)
    follower.catch_up()
    assert batches_seen(metrics) == (1, 1.0)
    # Three short batches end between two looks, the last followed by an idle update
    query.ran(1, 100)
    query.ran(2, 200)
    query.ran(3, 300)
    query.idled(4)
    follower.catch_up()
    assert batches_seen(metrics) == (4, 1.6)


def test_a_query_started_again_from_its_checkpoint_counts_only_its_own_batches() -> None:
    metrics = IngestMetrics()
    follower = BatchFollower(metrics)
    first = Progressing()
    follower.follow(first)  # type: ignore[arg-type]
    first.ran(500, 1000)
    follower.catch_up()
    # The query fails and starts again: its batch ids go on from the checkpoint's, and its
    # progress is its own run's
    again = Progressing()
    follower.follow(again)  # type: ignore[arg-type]
    follower.catch_up()
    again.ran(501, 2000)
    again.ran(502, 3000)
    follower.catch_up()
    assert batches_seen(metrics) == (3, 6.0)
