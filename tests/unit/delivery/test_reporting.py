"""What a runner tells others (delivery/reporting.py): copies skipped, state rebuilt, and its
report to the API."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from delivery.breaker import CircuitBreaker
from delivery.reporting import QUIET_REPORT_MS, RunnerReporting
from setu.errors import DependencyUnavailable
from setu.ordering.groups import Standing
from setu.ordering.tiers import DLQ, MAIN
from state.groups_stub import StubGroupStore
from state.workers import STATS_FRESH_MS, StubWorkers
from tests.unit.delivery.sim import subscription


class Metrics:
    def __init__(self) -> None:
        self.stale = 0
        self.rebuilt_partitions = 0

    def stale_copies(self, n: int) -> None:
        self.stale += n

    def rebuilt(self, partitions: int) -> None:
        self.rebuilt_partitions += partitions


class Engine:
    def __init__(self, failed_groups: int = 1) -> None:
        self.stale_copies = self.replay_copies = 0
        self.in_flight = 2
        self.states = {f"g{n}": object() for n in range(failed_groups)}

    def retry_backlog(self) -> int:
        return 3


class Port:
    def __init__(self) -> None:
        self.engine = Engine()


def reporting(
    metrics: Metrics,
    workers: StubWorkers,
    retention: Callable[[str], Awaitable[int | None]] | None = None,
) -> RunnerReporting:
    sub = subscription()
    return RunnerReporting(
        sub,
        "w",
        workers,
        StubGroupStore(),
        {MAIN: "main", 1: "rq.1", 2: "rq.2", DLQ: "dlq"},
        CircuitBreaker(sub.policies.circuit_breaker, "s"),
        metrics,  # type: ignore[arg-type]
        retention,
    )


def test_copies_skipped_during_a_batch_are_counted_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    metrics = Metrics()
    made = reporting(metrics, StubWorkers())
    ports: dict[int, Any] = {0: Port(), 1: Port()}
    before = made.skipped_copies(ports)
    ports[0].engine.stale_copies = 2
    ports[1].engine.replay_copies = 5
    with caplog.at_level(logging.INFO):
        made.skipped_since(before, ports)
    assert metrics.stale == 2
    assert "skipped 5 main-log records a replayed ingest batch wrote again" in caplog.text
    assert "skipped 2 copies written by a worker that had lost the partition" in caplog.text


def test_a_rebuild_after_redis_forgot_is_counted_and_nothing_is_said_of_none() -> None:
    metrics = Metrics()
    made = reporting(metrics, StubWorkers())
    made.rebuilt(0)
    made.rebuilt(3)
    assert metrics.rebuilt_partitions == 3


async def test_the_report_sums_this_workers_partitions() -> None:
    workers = StubWorkers()
    made = reporting(Metrics(), workers)
    engines: dict[int, Any] = {0: Engine(), 4: Engine()}
    await made.report(engines, paused=False, slots=8)
    [report] = await workers.fresh("p", "s", 0)
    assert (report["in_flight"], report["retry_backlog"], report["partitions"]) == (4, 6, [0, 4])
    assert (report["paused"], report["slots"], report["breaker"]["state"]) == (False, 8, "closed")


async def test_unchanged_figures_are_told_again_only_every_few_seconds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    workers = StubWorkers()
    made = reporting(Metrics(), workers)
    engines: dict[int, Any] = {0: Engine()}
    clock = [1_000_000]
    monkeypatch.setattr("delivery.reporting.now_ms", lambda: clock[0])
    await made.report(engines, paused=False, slots=8)
    # The same figures two seconds later are not written again
    clock[0] += 2_000
    await made.report(engines, paused=False, slots=8)
    [report] = await workers.fresh("p", "s", clock[0])
    assert report["at"] == 1_000_000
    # A change is, at once
    await made.report(engines, paused=True, slots=8)
    [report] = await workers.fresh("p", "s", clock[0])
    assert (report["at"], report["paused"]) == (1_002_000, True)
    # And unchanged figures are, once QUIET_REPORT_MS passed, well inside the API's freshness
    clock[0] += QUIET_REPORT_MS
    await made.report(engines, paused=True, slots=8)
    [report] = await workers.fresh("p", "s", clock[0])
    assert report["at"] == clock[0]
    assert QUIET_REPORT_MS * 2 <= STATS_FRESH_MS


async def test_a_retention_kafka_cannot_tell_yet_is_asked_again_and_the_report_goes_out() -> None:
    # Given a runner whose DLQ's retention the broker cannot tell at first (a topic just made
    # is not on every broker at once)
    workers = StubWorkers()
    asked: list[str] = []

    async def retention(topic: str) -> int | None:
        asked.append(topic)
        if len(asked) == 1:
            raise DependencyUnavailable("Kafka: Unknown topic or partition")
        return 86_400_000

    made = reporting(Metrics(), workers, retention)
    engines: dict[int, Any] = {0: Engine()}
    # When it reports
    await made.report(engines, paused=False, slots=8)
    # Then the report is written all the same, the retention left unknown
    [report] = await workers.fresh("p", "s", 0)
    assert report["partitions"] == [0] and made.retention_ms is None
    # And the next report that is written asks again and learns it
    await made.report(engines, paused=True, slots=8)
    assert made.retention_ms is not None
    assert set(made.retention_ms.values()) == {86_400_000}


class CountedStore(StubGroupStore):
    def __init__(self) -> None:
        super().__init__()
        self.asked = 0

    async def oldest_unhealthy(self) -> dict[Standing, int]:
        self.asked += 1
        return await super().oldest_unhealthy()


async def test_only_a_worker_holding_failed_groups_asks_redis_for_their_age() -> None:
    sub = subscription()
    store = CountedStore()
    made = RunnerReporting(
        sub,
        "w",
        StubWorkers(),
        store,
        {MAIN: "main", 1: "rq.1", 2: "rq.2", DLQ: "dlq"},
        CircuitBreaker(sub.policies.circuit_breaker, "s"),
        Metrics(),  # type: ignore[arg-type]
    )
    # Its partitions hold no failed group: the report goes out without asking
    await made.report({0: Engine(failed_groups=0)}, paused=False, slots=8)
    assert (store.asked, made.oldest_failed) == (0, {})
    # One of them holds one: the age is asked with the report
    await made.report({0: Engine(failed_groups=1)}, paused=True, slots=8)
    assert store.asked == 1
