"""What a subscription's runner tells others: its live figures for the worker's metrics
(read at scrape time), its report to the API (``state.workers``: in flight, backlog,
partitions, breaker, every ``stats_interval_ms``), and its confirmation of an operator's stop
(docs/policies.md §6)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any, Protocol

from delivery.breaker import CircuitBreaker
from delivery.engine import PartitionEngine
from delivery.guards import breaker_report
from delivery.metrics import RunnerFigures, SubscriptionMetrics
from delivery.ticker import at_once
from setu.clock import now_ms
from setu.errors import DependencyUnavailable
from setu.model import Subscription
from setu.ordering.groups import Standing, standing
from setu.ordering.tiers import DLQ, MAIN
from state.groups import GroupStore
from state.workers import WorkerReports

log = logging.getLogger(__name__)

# Unchanged figures are reported again this often (the API counts a report fresh for
# state.workers.STATS_FRESH_MS, 10 s).
QUIET_REPORT_MS = 5_000


class _HasEngine(Protocol):
    engine: PartitionEngine


class RunnerReporting:
    def __init__(
        self,
        sub: Subscription,
        worker_id: str,
        reports: WorkerReports,
        store: GroupStore,
        topics: Mapping[int, str],
        breaker: CircuitBreaker,
        metrics: SubscriptionMetrics,
        retention: Callable[[str], Awaitable[int | None]] | None = None,
    ) -> None:
        """``topics``: the runner's tier -> topic; ``retention``: a Kafka topic's retention
        in ms (None: for ever), for the expiry of failed groups' messages (None: unknown)."""
        self.sub = sub
        self._worker_id = worker_id
        self._reports = reports
        self._store = store
        self._topics = topics
        self._breaker = breaker
        self._metrics = metrics
        self._retention = retention
        # Per standing: when the longest-unhealthy group first failed, and how long the
        # topics holding such groups' messages keep them (docs/design.md §4).
        self.oldest_failed: dict[Standing, int] = {}
        self.retention_ms: dict[Standing, int | None] | None = None
        self._last: tuple[dict[str, Any], int] | None = None  # the last report and when

    @staticmethod
    def skipped_copies(ports: Mapping[int, _HasEngine]) -> tuple[int, int]:
        """Copies the engines skipped so far: (written by a worker that had lost the
        partition, main records a replayed ingest batch wrote again)."""
        engines = [port.engine for port in ports.values()]
        return sum(e.stale_copies for e in engines), sum(e.replay_copies for e in engines)

    def skipped_since(self, before: tuple[int, int], ports: Mapping[int, _HasEngine]) -> None:
        """Counts and logs the copies skipped since ``before`` (:meth:`skipped_copies`)."""
        (stale_now, replays_now), (stale_then, replays_then) = self.skipped_copies(ports), before
        stale, replays = stale_now - stale_then, replays_now - replays_then
        if replays > 0:
            log.info(
                "subscription %s/%s: skipped %d main-log records a replayed ingest batch "
                "wrote again",
                self.sub.project,
                self.sub.name,
                replays,
            )
        if stale > 0:
            self._metrics.stale_copies(stale)
            log.warning(
                "subscription %s/%s: skipped %d copies written by a worker that had lost "
                "the partition",
                self.sub.project,
                self.sub.name,
                stale,
            )

    def rebuilt(self, partitions: int) -> None:
        """A takeover found Redis had lost the group state of ``partitions`` partition(s)
        and rebuilt it from the changelog."""
        if partitions:
            self._metrics.rebuilt(partitions)
            log.warning(
                "subscription %s/%s: Redis had lost the group state of %d partition(s); "
                "rebuilt from the changelog",
                self.sub.project,
                self.sub.name,
                partitions,
            )

    def figures(self, engines: list[PartitionEngine]) -> RunnerFigures:
        """Live figures for the worker's metrics."""
        states = [s for e in engines for s in e.states.values()]
        dead = sum(1 for s in states if standing(s)[0] is Standing.DEAD_LETTERED)
        scheduled = sum(1 for s in states if standing(s)[0] is Standing.SCHEDULED)
        return RunnerFigures(
            project=self.sub.project,
            subscription=self.sub.name,
            partitions=len(engines),
            in_flight=sum(e.in_flight for e in engines),
            buffered=sum(e.open_count(t) for e in engines for t in self._topics),
            retry_backlog=sum(e.retry_backlog() for e in engines),
            retrying_groups=len(states) - dead - scheduled,
            dead_lettered_groups=dead,
            scheduled_groups=scheduled,
            parked=sum(s.counts[DLQ] for s in states),
            oldest_failed_ms={
                k.value: at for k, at in self.oldest_failed.items() if k is not Standing.SCHEDULED
            },
            retention_ms={k.value: ms for k, ms in (self.retention_ms or {}).items()},
            oldest_held_ms=min(
                (at for e in engines if (at := e.oldest_held_ms()) is not None), default=None
            ),
            breaker=self._breaker.rules.state.value,
        )

    async def report(
        self, engines: Mapping[int, PartitionEngine], paused: bool, slots: int | None
    ) -> None:
        """Tells the API this worker's share of the subscription (``engines`` by partition);
        figures that did not change are told again only every ``QUIET_REPORT_MS``, which keeps
        the report fresh (``state.workers.STATS_FRESH_MS``) at a fraction of the round trips."""
        await at_once(lambda: self.report_tick(engines, paused, slots))

    def report_tick(
        self, engines: Mapping[int, PartitionEngine], paused: bool, slots: int | None
    ) -> Coroutine[Any, Any, None] | None:
        """:meth:`report` as periodic work: None while the figures are unchanged and were told
        less than ``QUIET_REPORT_MS`` ago."""
        figures: dict[str, Any] = {
            "in_flight": sum(e.in_flight for e in engines.values()),
            "retry_backlog": sum(e.retry_backlog() for e in engines.values()),
            "partitions": sorted(engines),
            "paused": paused,
            "breaker": breaker_report(self._breaker.rules.view()),
            "slots": slots,
        }
        at = now_ms()
        last = self._last
        if last is not None and last[0] == figures and at - last[1] < QUIET_REPORT_MS:
            return None
        # Only the owner of a partition holds its failed groups: one whose engines hold none
        # has nothing to say of their age, and need not ask Redis every report.
        unhealthy = any(e.states for e in engines.values())
        return self._send(figures, at, unhealthy)

    async def _send(self, figures: dict[str, Any], at: int, unhealthy: bool) -> None:
        self.oldest_failed = await self._store.oldest_unhealthy() if unhealthy else {}
        # Read once a group failed: before, its tiers and DLQ may not exist
        # (delivery/own_topics.py), and nothing waits there whose expiry could be told.
        if unhealthy and self.retention_ms is None and self._retention is not None:
            tier = self._topics[1] if self.sub.retry.tiers else self._topics[MAIN]
            try:
                self.retention_ms = {
                    Standing.RETRYING: await self._retention(tier),
                    Standing.DEAD_LETTERED: await self._retention(self._topics[DLQ]),
                }
            except DependencyUnavailable as exc:
                # Asked again at the next report: a topic just made is not on every broker
                # at once (1,000 new subscriptions' runners failed on this).
                log.info("%s/%s: retention not read yet: %s", self.sub.project, self.sub.name, exc)
        report = {**figures, "at": at}
        await self._reports.report(self.sub.project, self.sub.name, self._worker_id, report)
        self._last = (figures, at)

    async def forget(self) -> None:
        with contextlib.suppress(Exception):
            await self._reports.forget(self.sub.project, self.sub.name, self._worker_id)

    async def confirm_stop(self, record: dict[str, Any]) -> None:
        """Tells the API how this worker carried out an operator's stop."""
        try:
            await self._reports.confirm_stop(
                self.sub.project, self.sub.name, self._worker_id, record
            )
        except Exception as exc:  # the stop happened; only its confirmation is missing
            log.warning(
                "subscription %s/%s: stop not confirmed: %s", self.sub.project, self.sub.name, exc
            )
