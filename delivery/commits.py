"""What a subscription's consumer commits, and the housekeeping that follows commits.

Every ``commit_interval_ms`` the runner flushes the recorded 2xx outcomes (and the state
changes that go with them), then commits, per tier partition, what its engine says is safe
("flush, then commit"); the main log's commit carries the ingest marks of the records below
it (:mod:`delivery.replays`). After a commit, outcomes below it are forgotten in Redis. Also
here: forgetting dead letters that retention removed, and picking up an operator's releases.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Callable, Coroutine, Iterator, Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from delivery.effects import PartitionEffects
from delivery.pace import CommitPace
from delivery.parts import ConsumerPort, RunnerConfig
from delivery.replays import encode_marks
from delivery.ticker import Periodic, at_once
from delivery.watch import BACKSTOP_MS, StateWatch, Watched
from delivery.writer import StateWriter
from setu.clock import now_ms
from setu.ordering.tiers import DLQ, MAIN
from state.durable_groups import DurableGroupStore
from state.groups import GroupStore
from state.kafka_reader import COORDINATOR_MOVING, KafkaReader

log = logging.getLogger(__name__)


# How often a resting runner looks for something to commit, or an operator's release, anyway
# (a backstop: every change to commit comes with records, and a release request with the
# worker's reading of Redis, which wake it).
COMMIT_REST_MS = 5000

# Errors of a commit (or an offset read) that mean Kafka or the group's coordinator is away
# for now.
TRANSIENT_CODES = COORDINATOR_MOVING | {
    # A topic made a moment ago (a subscription's first failure makes its tiers) that the
    # group's coordinator or a broker does not serve yet.
    KafkaError.UNKNOWN_TOPIC_OR_PART,
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError._TRANSPORT,
    KafkaError._ALL_BROKERS_DOWN,
    KafkaError._TIMED_OUT,
    KafkaError._WAIT_COORD,
    KafkaError.REQUEST_TIMED_OUT,
    KafkaError.NETWORK_EXCEPTION,
}


def transient(error: BaseException) -> bool:
    """Whether a failed commit or offset read may simply be tried again later (no answer in
    time, or Kafka says so); one that says the partitions are no longer this runner's is
    not."""
    if isinstance(error, TimeoutError):
        return True
    if isinstance(error, KafkaException) and error.args and isinstance(error.args[0], KafkaError):
        kafka_error: KafkaError = error.args[0]
        return kafka_error.code() in TRANSIENT_CODES or bool(kafka_error.retriable())
    return False


class Commits:
    def __init__(
        self,
        consumer: ConsumerPort,
        topics: Mapping[int, str],
        tiers: Mapping[str, int],
        ports: Mapping[int, PartitionEffects],
        writer: StateWriter,
        store: GroupStore,
        reader: KafkaReader,
        background: Callable[[Coroutine[Any, Any, None]], None],
        watch: StateWatch | None = None,
        present: Callable[[str], bool] = lambda _: True,
        pace: CommitPace | None = None,
    ) -> None:
        """``topics`` (tier -> topic), ``tiers`` (topic -> tier) and ``ports`` are the
        runner's own; ``background`` runs housekeeping nothing waits for; ``watch``: the
        worker's reading of Redis (None: every tick asks Redis); ``present``: whether a topic
        of the subscription exists (its tiers and DLQ are made at its first copy there,
        delivery/own_topics.py): Kafka refuses a commit naming one that does not; ``pace``:
        the worker's pace of periodic commits (delivery/pace.py; None: not paced)."""
        self._consumer = consumer
        self._topics = topics
        self._tiers = tiers
        self._ports = ports
        self._writer = writer
        self._store = store
        self._reader = reader
        self._background = background
        self._committed: dict[tuple[int, int], int] = {}  # (tier, partition) -> offset
        self._watch = watch
        self._present = present
        self._pace = pace
        self._watched: Watched | None = None
        # What the last poll saw: (release version, partitions), and when.
        self._polled: tuple[int | None, frozenset[int]] | None = None
        self._polled_at_ms = 0

    def periodic(self, config: RunnerConfig) -> list[Periodic]:
        return [
            # Resting, nothing is left to commit once a round found nothing (records wake it).
            Periodic(
                config.commit_interval_ms, self.commit_tick, rests=True, rest_ms=COMMIT_REST_MS
            ),
            # Resting, the worker's reading wakes it when a release was asked for (watch.py).
            Periodic(
                config.release_poll_ms, self.releases_tick, rests=True, rest_ms=COMMIT_REST_MS
            ),
            Periodic(config.dead_letter_trim_ms, self.trim_dead_letters),
        ]

    def assigned(self, tier: int, partition: int) -> None:
        """A tier partition taken over: whatever was committed before is not known."""
        self._committed.pop((tier, partition), None)

    async def commit(self) -> None:
        """Flush, then commit what every engine says is safe, then forget older outcomes."""
        if not self._writer.idle:
            await self._writer.flush()
        consumer = self._consumer
        if not consumer.running:
            return
        offsets = self._uncommitted()
        if not offsets:
            return
        try:
            await consumer.call(lambda c: c.commit(offsets=offsets, asynchronous=False))
        except (TimeoutError, KafkaException) as exc:
            if not transient(exc):
                raise
            # Kafka away (a broker restarting, its coordinator moving): delivery goes on and
            # the same offsets are committed at the next tick. Failing the runner instead
            # would start it again from the last commit, and every record delivered since
            # would be read again.
            names = sorted({tp.topic for tp in offsets})
            log.warning("commit of %s failed, tried again at the next tick: %r", names, exc)
            return
        for tp in offsets:
            self._committed[(self._tiers[tp.topic], tp.partition)] = tp.offset
        self.committed(offsets)

    def commit_tick(self) -> Coroutine[Any, Any, None] | None:
        """:meth:`commit` as periodic work: None when nothing waits to be written or
        committed. A commit waits for its turn of the worker's pace (delivery/pace.py);
        the 2xx outcomes are written meanwhile (the runner nudges its writer every 50 ms)."""
        if not self._consumer.running or next(self._changed(), None) is None:
            return None if self._writer.idle else self._writer.flush()
        return self.commit() if self._pace is None else self._paced_commit()

    async def _paced_commit(self) -> None:
        assert self._pace is not None
        await self._pace.turn()
        await self.commit()

    def _uncommitted(self) -> list[TopicPartition]:
        """What every engine says is safe to commit and was not committed yet."""
        return [self.position(port, tier, offset) for port, tier, offset in self._changed()]

    def _changed(self) -> Iterator[tuple[PartitionEffects, int, int]]:
        """(port, tier, offset) of every position not committed yet: asked of every runner
        each tick, so a position (and its ingest marks) is built only when one is."""
        for port in list(self._ports.values()):
            for tier, offset in port.engine.committable().items():
                if self._committed.get((tier, port.partition)) != offset and self._present(
                    self._topics[tier]
                ):
                    yield port, tier, offset

    def positions(self, port: PartitionEffects) -> list[TopicPartition]:
        """What the engine of ``port`` says is safe to commit, in topics that exist."""
        return [
            self.position(port, tier, offset)
            for tier, offset in port.engine.committable().items()
            if self._present(self._topics[tier])
        ]

    def position(self, port: PartitionEffects, tier: int, offset: int) -> TopicPartition:
        """What to commit for one tier partition; the main log's carries the ingest marks of
        the records below it (:mod:`delivery.replays`)."""
        topic = self._topics[tier]
        if tier != MAIN:
            return TopicPartition(topic, port.partition, offset)
        metadata = encode_marks(port.engine.ingest_marks(offset))
        return TopicPartition(topic, port.partition, offset, metadata=metadata)

    def committed(self, offsets: list[TopicPartition]) -> None:
        """Offsets committed (here, or by the consumer on revocation): outcomes below them
        are forgotten in the background."""
        by_index: dict[int, dict[int, int]] = defaultdict(dict)
        for tp in offsets:
            by_index[tp.partition][self._tiers[tp.topic]] = tp.offset
        for partition, committed in by_index.items():
            self._background(self._trim(partition, committed))

    async def _trim(self, partition: int, committed: dict[int, int]) -> None:
        try:
            await self._store.trim(partition, committed)
        except Exception as exc:  # trimming is housekeeping; the next commit trims again
            log.warning("trimming outcomes of partition %d failed: %s", partition, exc)

    async def trim_dead_letters(self) -> None:
        """Forgets dead letters retention removed (housekeeping: failures are only logged)."""
        topic = self._topics[DLQ]
        if not self._present(topic):
            return
        for port in list(self._ports.values()):
            try:
                first = await asyncio.to_thread(self._reader.first_offset, topic, port.partition)
                await self._store.trim_dead_letters(port.partition, first)
            except Exception as exc:
                log.warning("trimming dead letters of partition %d failed: %s", port.partition, exc)

    def start_watching(self, project: str, subscription: str, store: object) -> None:
        """Hands the periodic reading of Redis to the worker's watch, if there is one."""
        if self._watch is not None:
            verifiable = store if isinstance(store, DurableGroupStore) else None
            self._watched = self._watch.watch(project, subscription, verifiable)

    @property
    def watched(self) -> Watched | None:
        return self._watched

    def stop_watching(self) -> None:
        if self._watch is not None and self._watched is not None:
            self._watch.forget(self._watched)
            self._watched = None

    async def poll_releases(self) -> None:
        """Picks up an operator's unsideline of groups and single dead letters, and checks
        that Redis still holds what this runner wrote (``GroupStore.poll_releases``); from
        the worker's watch's reading while it is fresh (delivery/watch.py)."""
        await at_once(self.releases_tick)

    def releases_tick(self) -> Coroutine[Any, Any, None] | None:
        """:meth:`poll_releases` as periodic work: None when the worker's reading is fresh
        and says nothing was released since the last poll."""
        watched = self._watched
        if watched is None or not watched.fresh():
            return self._poll_releases()
        watched.verify()
        seen = (watched.version, frozenset(self._ports))
        if seen == self._polled and now_ms() - self._polled_at_ms < BACKSTOP_MS:
            return None
        return self._poll_seen(seen)

    async def _poll_seen(self, seen: tuple[int | None, frozenset[int]]) -> None:
        await self._poll_releases()
        self._polled, self._polled_at_ms = seen, now_ms()

    async def _poll_releases(self) -> None:
        for port in list(self._ports.values()):
            groups, offsets = await self._store.poll_releases(port.partition)
            if port.alive and (groups or offsets):
                port.engine.release_groups(groups)
                port.engine.add_pending_releases(offsets)
