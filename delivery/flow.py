"""Which of a subscription's tier partitions the consumer reads, and from where: pauses with
reasons, holds of a retry tier until its head is due, seeks, and back-pressure.

A tier partition is paused while it has any reason to be (a hold, the subscription paused,
too many of its records in memory, the worker full) and resumed when the last one goes. Every
pause and seek is a command the consumer thread runs between two polls; one posted for a
partition that was given up meanwhile never runs (:meth:`PartitionFlow.post_for`).

Back-pressure: consuming stops while the subscription holds more than its limit of records in
memory, and starts again below 3/4; a worker that stays full pauses its partitions instead, so
the consumer keeps polling (and serving rebalances). With several partition indices, a tier
partition holding most of the budget is paused (its groups are slow) so the others flow.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from confluent_kafka import Consumer, KafkaException, TopicPartition

from delivery.engine import PartitionEngine
from delivery.parts import SEEK_RETRY_S, ConsumerPort
from setu.clock import now_ms

log = logging.getLogger(__name__)

HOLD = "hold"
PRESSURE = "pressure"
PAUSED = "paused"
FULL = "full"
# Consuming stops for at most this long when the worker is full; then partitions are paused
# instead, so the consumer keeps polling (and serving rebalances).
FULL_STOP_S = 1.0
# A refused seek is tried again after RunnerConfig.seek_retry_s, doubling up to this; the
# first few failures are expected around an assignment and logged quietly.
SEEK_RETRY_MAX_S = 1.0
SEEK_RETRIES_QUIET = 3


class FlowPort(Protocol):
    """A partition index as the flow sees it: its engine, and whether it is still ours."""

    partition: int
    engine: PartitionEngine
    alive: bool


class PartitionFlow:
    def __init__(
        self,
        consumer: ConsumerPort,
        topics: Mapping[int, str],
        ports: Mapping[int, FlowPort],
        limit: Callable[[], int],
        seek_retry_s: float = SEEK_RETRY_S,
    ) -> None:
        """``topics`` (tier -> topic) and ``ports`` (partition -> port) are the runner's own,
        read as they are; ``limit`` is how many records the subscription may hold."""
        self._consumer = consumer
        self._topics = topics
        self._ports = ports
        self._limit = limit
        self._seek_retry_s = seek_retry_s
        self._reasons: dict[tuple[int, int], set[str]] = defaultdict(set)
        self._full_since: float | None = None

    # Commands for the consumer thread

    def post(self, command: Callable[[Consumer], Any], then: Any = None) -> None:
        self._consumer.post(command, then)

    def post_for(
        self, port: FlowPort, command: Callable[[Consumer], None], then: Any = None
    ) -> None:
        """Posts a command about ``port``'s partitions that runs only while the port is alive.
        A pause or seek posted for an assignment and run after the next one (the consumer
        thread runs commands between polls, and a rebalance happens inside a poll) would act
        on partitions their new engine knows nothing of: a pause stopping them for good, a
        seek skipping records. The runner marks a revoked port dead before the consumer
        thread goes on to the next assignment."""

        def guarded(consumer: Consumer) -> None:
            if port.alive:
                command(consumer)

        self.post(guarded, then)

    # Pauses

    def reason(self, partition: int, tier: int, reason: str, on: bool) -> None:
        """Adds or removes a reason to pause one tier partition; pauses on the first and
        resumes when none is left."""
        reasons = self._reasons[(partition, tier)]
        before = bool(reasons)
        if on:
            reasons.add(reason)
        else:
            reasons.discard(reason)
        port = self._ports.get(partition)
        if before == bool(reasons) or port is None:
            return
        tp = [TopicPartition(self._topics[tier], partition)]
        if reasons:
            self.post_for(port, lambda c: c.pause(tp))
        else:
            self.post_for(port, lambda c: c.resume(tp))

    def set_paused(self, paused: bool) -> None:
        """The subscription paused or resumed: every tier partition of every port."""
        self._every_partition(PAUSED, paused)

    def assigned(self, partition: int, tiers: Iterable[int], paused: bool) -> None:
        """A partition index taken over: it starts with no reasons but the subscription's
        pause (its tier partitions start paused through the assignment itself)."""
        for tier in tiers:
            self._reasons.pop((partition, tier), None)
            if paused:
                self._reasons[(partition, tier)].add(PAUSED)

    def paused_at_start(self, partitions: Iterable[int]) -> list[TopicPartition]:
        """The tier partitions of ``partitions`` that have a reason to start paused."""
        wanted = set(partitions)
        return [
            TopicPartition(self._topics[tier], partition)
            for (partition, tier), reasons in self._reasons.items()
            if reasons and partition in wanted
        ]

    def forget(self, partition: int) -> None:
        """A partition index given up: its reasons go with it."""
        for tier in self._topics:
            self._reasons.pop((partition, tier), None)

    # Holds and seeks

    def hold(self, port: FlowPort, tier: int, offset: int, until_ms: int) -> None:
        """Pauses the tier partition back at ``offset`` until ``until_ms``; it is let go only
        once both the time has come and the seek has taken."""
        self.reason(port.partition, tier, HOLD, True)
        waiting = {"seek", "time"}

        def done(what: str) -> None:
            waiting.discard(what)
            if not waiting:
                self._unhold(port, tier, offset)

        self._seek(port, tier, offset, lambda: done("seek"))
        delay = max(0.0, (until_ms - now_ms()) / 1000)
        asyncio.get_running_loop().call_later(delay, done, "time")

    def _unhold(self, port: FlowPort, tier: int, offset: int) -> None:
        if not port.alive:
            return
        self.reason(port.partition, tier, HOLD, False)

        def unblocked() -> None:
            if port.alive:
                port.engine.unblocked(tier, offset)

        self.post(lambda c: None, unblocked)

    def seek(self, port: FlowPort, tier: int, offset: int) -> None:
        self._seek(port, tier, offset, lambda: port.engine.unblocked(tier, offset))

    def _seek(
        self, port: FlowPort, tier: int, offset: int, then: Callable[[], None], attempt: int = 0
    ) -> None:
        """Moves the tier partition's consumer to ``offset``, then runs ``then`` on the loop,
        between the batches fetched before the seek and those fetched after it. A seek that
        fails (librdkafka refuses it with an erroneous state while the partition's fetcher is
        still starting, e.g. just after an assignment) is tried again until it takes: the
        engine waits for it, and going on without it would skip the records in between."""
        tp = TopicPartition(self._topics[tier], port.partition, offset)
        failed: list[KafkaException] = []

        def command(consumer: Consumer) -> None:
            try:
                consumer.seek(tp)
            except KafkaException as exc:
                failed.append(exc)

        def settled() -> None:
            if not port.alive:
                return
            if not failed:
                then()
                return
            log.log(
                logging.WARNING if attempt >= SEEK_RETRIES_QUIET else logging.INFO,
                "partition %d tier %d: seek to %d failed (%s); trying again",
                port.partition,
                tier,
                offset,
                failed[0],
            )
            delay = min(self._seek_retry_s * 2**attempt, SEEK_RETRY_MAX_S)
            asyncio.get_running_loop().call_later(
                delay, self._seek, port, tier, offset, then, attempt + 1
            )

        self.post_for(port, command, settled)

    # Back-pressure

    def buffered(self) -> dict[tuple[int, int], int]:
        """Records in memory per (partition, tier)."""
        return {
            (port.partition, tier): port.engine.open_count(tier)
            for port in self._ports.values()
            for tier in self._topics
        }

    def regulate(self) -> None:
        """Stops consuming while too many records are in memory, and starts again below 3/4.
        Stopping is cheap (nothing fetched is thrown away) but must stay short; when the
        worker stays full, its partitions are paused instead."""
        self._regulate(sum(self.buffered().values()))

    def _regulate(self, total: int) -> None:
        consumer = self._consumer
        limit = self._limit()
        loop_time = asyncio.get_running_loop().time()
        if total > limit:
            if self._full_since is None:
                self._full_since = loop_time
                consumer.flowing.clear()
            elif loop_time - self._full_since > FULL_STOP_S and consumer.flowing.is_set() is False:
                self._every_partition(FULL, True)
                consumer.flowing.set()
        elif total < limit * 3 // 4 and self._full_since is not None:
            self._full_since = None
            self._every_partition(FULL, False)
            consumer.flowing.set()

    def balance(self) -> None:
        """Back-pressure, every few tens of milliseconds: :meth:`regulate`, and with more than
        one partition index, a tier partition holding most of the budget is paused."""
        buffered = self.buffered()
        total = sum(buffered.values())
        if not total and self._unheld():
            return  # nothing in memory and nothing held back: the idle case
        self._regulate(total)
        limit = self._limit()
        several = len(self._ports) > 1
        for (partition, tier), count in buffered.items():
            held = PRESSURE in self._reasons.get((partition, tier), ())
            if not held and several and count > limit * 3 // 4:
                self.reason(partition, tier, PRESSURE, True)
            elif held and (count < limit // 4 or not several):
                self.reason(partition, tier, PRESSURE, False)

    def idle(self) -> bool:
        """Nothing in memory and nothing held back: :meth:`balance` has nothing to do until
        records arrive."""
        # No dict of every (partition, tier) here: asked of each runner at each of its ticks.
        return self._unheld() and not any(port.engine.any_open() for port in self._ports.values())

    def _unheld(self) -> bool:
        return self._full_since is None and not any(
            PRESSURE in reasons for reasons in self._reasons.values()
        )

    def _every_partition(self, reason: str, on: bool) -> None:
        for port in self._ports.values():
            for tier in self._topics:
                self.reason(port.partition, tier, reason, on)
