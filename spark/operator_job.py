"""``setu ingest``, in real-time mode or in micro-batches: the query of :mod:`spark.stream`
through the JVM de-duplication operator (decision 0008), and what the driver does beside it.

- Its checkpoint is ``{checkpoint}/operator``. Its first start takes over from the checkpoint
  an earlier version's Python micro-batch job left in ``{checkpoint}`` (its ``python`` mode,
  :mod:`spark.migration`): it starts reading where that job's last
  committed batch ended, with the operator's state seeded from the marks it kept, and those
  marks are written to the changelog too, so Redis can be given them again.
- The producer marks changelog (``MARKS_TOPIC``, compacted) is made before the query starts;
  :class:`spark.marks_changelog.MarksFollower` raises its marks in Redis, and publishes them
  all again when Redis forgot them.
- Every second :class:`CountsFollower` adds the operator's per-topic counts to the metrics as
  they grow, tasks still running included (in real-time mode a task lasts the whole batch,
  ``SETU_SPARK_REALTIME_BATCH_S``, and Spark adds an accumulator's counts only as a task
  ends), and :class:`BatchFollower` records each ended batch's duration.
- The query reads the retired topics and the main topics' limits when it starts; when either
  changes, and in real-time mode when an ingest topic or partition appears (each one needs a
  task of its own), :class:`QueryInputs` tells ``job.keep_running`` to start it again.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Collection, Mapping
from typing import Any

from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient
from pyarrow import fs as pafs
from pyspark.sql import SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from setu.errors import DependencyUnavailable
from setu.limits import MessageLimits
from setu.names import INGEST_QUERY_CHECKPOINT
from setu.settings import Settings, is_local_master
from spark import stream
from spark.dedup import decode_marks
from spark.dedup_state import checkpoint_fs
from spark.marks import MarkPublisher
from spark.marks_changelog import MarksFollower
from spark.metrics import IngestMetrics
from spark.migration import last_committed, seed_marks, starting_offsets
from state.kafka_admin import KafkaTopics

log = logging.getLogger(__name__)

# Latency over batching: a shuffle block leaves after at most this long (real-time mode).
NETWORK_BUFFER_WAIT_MS = "5"
# How often executors report their running tasks, and with them the operator's counts (real-time
# mode, where a task runs for the whole batch: CountsFollower).
HEARTBEAT_INTERVAL = "2s"
# How often the ingest topics are listed for new partitions (real-time mode).
TOPICS_EVERY_S = 1.0
# How long the job waits, at its start, for a Kafka that does not answer (until_kafka_answers).
KAFKA_PATIENCE_S = 300.0


def slots_needed(settings: Settings, partitions: int) -> int:
    """Task slots the real-time query holds for the whole batch: one per ingest partition it
    reads and one per shuffle partition."""
    return partitions + settings.spark_shuffle_partitions


def local_slots(settings: Settings, partitions: int) -> int:
    """Threads a local master gets in real-time mode: ``SETU_SPARK_REALTIME_SLOTS``, or twice
    what ``partitions`` need if that is more (room for topics to come before a resize), up to
    what ``SETU_SPARK_REALTIME_MAX_PARTITIONS`` need (past it the query runs in micro-batches)."""
    partitions = min(partitions, settings.spark_realtime_max_partitions)
    return max(settings.spark_realtime_slots, 2 * slots_needed(settings, partitions))


class SlotsShort(Exception):
    """The real-time query needs more task slots than the local master has: the session must
    be built again with :func:`local_slots` of ``partitions``."""

    def __init__(self, partitions: int, needed: int, slots: int) -> None:
        super().__init__(f"real-time mode needs {needed} task slots, the local master has {slots}")
        self.partitions = partitions


def session_overrides(settings: Settings, partitions: int = 0) -> dict[str, str]:
    """Spark properties of real-time mode, besides ``job.session_config``'s; a local master
    gets :func:`local_slots` for ``partitions`` ingest partitions."""
    if settings.ingest_mode != "real-time":
        return {}
    conf = {
        "spark.shuffle.streaming.networkBufferMaxWaitTimeMs": NETWORK_BUFFER_WAIT_MS,
        # The streaming shuffle bounds what is in flight (writerMaxMemory, readerMaxMemory) by
        # counting network buffers, and a record larger than one buffer goes out in one of its
        # own: with the default 32 KiB buffers a burst of 1 MiB records held 500 MiB of direct
        # memory and killed the executor (test_memory_per_batch). A buffer that holds the
        # largest record keeps the bound; it is flushed after NETWORK_BUFFER_WAIT_MS anyway.
        "spark.shuffle.streaming.networkBufferSize": str(
            MessageLimits(settings.max_message_bytes).record_bytes
        ),
        "spark.executor.heartbeatInterval": HEARTBEAT_INTERVAL,
    }
    if is_local_master(settings.spark_master):
        # Every source and shuffle partition holds a task slot for the whole batch.
        conf["spark.master"] = f"local[{local_slots(settings, partitions)}]"
    return conf


class BatchFollower:
    """Records each batch's end and duration in the ingest metrics, from the running query's
    progress (read every second by :class:`CountsFollower`'s thread).

    Not a ``StreamingQueryListener``: Spark calls a listener's ``onQueryStarted`` on the
    query's thread before ``start()`` returns, and a Python listener makes that a call into
    the driver's Python process. On a loaded CI machine one start never returned, with the
    query already holding its name, and every later start in the session failed; the
    listener was the one step of that start waiting on the Python side (the hang was not
    reproduced here). Polling needs nothing of the query's start."""

    def __init__(self, metrics: IngestMetrics) -> None:
        self._metrics = metrics
        self._query: StreamingQuery | None = None
        self._last_id = -1
        # The counts follower's thread looks every second, the job's own thread after a
        # failure (OperatorRun.batches): one look at a time, so no batch counts twice.
        self._looking = threading.Lock()

    def follow(self, query: StreamingQuery) -> None:
        """From now on, the batches of ``query`` (a query started again from its checkpoint
        carries on its batch ids; those it ran before are not counted again)."""
        with self._looking:
            self._query, self._last_id = query, -1

    def catch_up(self) -> None:
        with self._looking:
            self._catch_up()

    def _catch_up(self) -> None:
        query = self._query
        if query is None:
            return
        last = query.lastProgress
        if not last:
            return
        # An idle query's progress names its next batch and ran nothing.
        newest = last["batchId"] if executed(last) else last["batchId"] - 1
        if newest <= self._last_id:
            return
        # Several batches may end between two looks (short micro-batches): the run's recent
        # progress says which.
        one = executed(last) and newest == self._last_id + 1
        for progress in [last] if one else query.recentProgress:
            if progress["batchId"] > self._last_id and executed(progress):
                self._batch_ended(progress)

    def _batch_ended(self, progress: Mapping[str, Any]) -> None:
        self._last_id = progress["batchId"]
        durations = progress["durationMs"]
        self._metrics.batch_written({}, durations.get("triggerExecution", 0) / 1000)
        # Where a batch's time went (planning, the offset and commit logs, the tasks):
        # in real-time mode the part outside the tasks is the pause records wait at a batch's
        # end (docs/latency.md).
        log.info(
            "batch %s ended: %s",
            progress["batchId"],
            ", ".join(f"{k} {v} ms" for k, v in sorted(durations.items())),
        )


def executed(progress: Mapping[str, Any]) -> bool:
    """Whether a progress update is a batch's end (an idle query's update runs nothing: it
    names the next batch and has no ``addBatch``)."""
    return "addBatch" in progress["durationMs"]


class CountsFollower:
    """Adds the operator's per-topic counts (:func:`spark.stream.live_counts`) to the ingest
    metrics every ``every_s``, and has ``batches`` look at the query's progress as often. A
    failed task's counts leave the live totals (its records are read again), so each topic's
    counts only ever rise to the highest seen."""

    def __init__(
        self,
        live: Any,
        metrics: IngestMetrics,
        every_s: float = 1.0,
        batches: BatchFollower | None = None,
    ) -> None:
        self._live = live
        self._metrics = metrics
        self._batches = batches
        self._every_s = every_s
        self._seen: dict[str, tuple[int, int]] = {}
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._main, name="ingest-counts", daemon=True)

    def start(self) -> CountsFollower:
        self._thread.start()
        return self

    def catch_up(self) -> None:
        added = {}
        for topic, (kept, dropped) in stream.read_counts(self._live).items():
            kept_before, dropped_before = self._seen.get(topic, (0, 0))
            now = (max(kept, kept_before), max(dropped, dropped_before))
            if now != (kept_before, dropped_before):
                added[topic] = (now[0] - kept_before, now[1] - dropped_before)
                self._seen[topic] = now
        if added:
            self._metrics.records_decided(added)

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(10)
        self._look()

    def _look(self) -> None:
        try:
            self.catch_up()
            if self._batches is not None:
                self._batches.catch_up()
        except Exception:  # the JVM going away as the job stops
            log.debug("could not read the operator's counts or progress", exc_info=True)

    def _main(self) -> None:
        while not self._stopping.wait(self._every_s):
            self._look()


def ingest_partitions(admin: AdminClient, pattern: str) -> dict[str, int]:
    """The ingest topics ``pattern`` matches now, with their partition counts."""
    matcher = re.compile(pattern)
    return {
        name: len(meta.partitions)
        for name, meta in admin.list_topics(timeout=30).topics.items()
        if matcher.fullmatch(name)
    }


def has_committed(checkpoint: str) -> bool:
    """Whether the query of ``checkpoint`` committed a batch (then it resumes from it). One
    that started and committed nothing is removed, and the take-over starts again: a query
    resuming a checkpoint reads neither the starting offsets nor the initial state again."""
    fs, root = checkpoint_fs(checkpoint.rstrip("/"))
    if last_committed(checkpoint) is not None:
        return True
    if fs.get_file_info(root).type != pafs.FileType.NotFound:
        log.info("removing %s: its query committed no batch", checkpoint)
        fs.delete_dir(root)
    return False


def write_seeds(
    bootstrap: str, client_config: Mapping[str, str], seeds: list[tuple[str, int, str]]
) -> int:
    """Writes the seeded marks to the changelog, as the operator writes a mark; returns how
    many. Without them Redis, once it forgot its marks, would not get these back."""
    producer = Producer({"bootstrap.servers": bootstrap, **client_config, "acks": "all"})
    written = 0
    for topic, partition, text in seeds:
        for (_, producer_id), mark in decode_marks(text).items():
            sequence = mark.partitions.get(partition)
            if sequence is None or sequence < 0:
                continue
            key = f"{topic}/{partition}/{producer_id}"
            producer.produce(stream.MARKS_TOPIC, f"{mark.incarnation}:{sequence}", key)
            written += 1
    if producer.flush(30) > 0:
        raise RuntimeError("the seeded producer marks were not all written to the changelog")
    return written


def operator_checkpoint(settings: Settings) -> str:
    return f"{settings.resolved_checkpoint_dir().rstrip('/')}/{INGEST_QUERY_CHECKPOINT}"


def start_query(
    spark: SparkSession,
    settings: Settings,
    pattern: str,
    *,
    limits: Callable[[], Mapping[str, int]],
    retired: Callable[[], Collection[str]],
    counts: Any,
    realtime: bool,
) -> StreamingQuery:
    """Starts the operator's query, in real-time mode or in micro-batches, taking over from
    the Python job's checkpoint on its first start (see the module doc)."""
    base = settings.resolved_checkpoint_dir().rstrip("/")
    own = operator_checkpoint(settings)
    bootstrap = settings.kafka_bootstrap or ""
    starting, initial = None, None
    if not has_committed(own):
        committed = last_committed(base)
        if committed is not None:
            admin = AdminClient({"bootstrap.servers": bootstrap, **settings.kafka_client_config()})
            partitions = ingest_partitions(admin, pattern)
            starting = starting_offsets(committed, partitions)
            seeds = seed_marks(base, committed)
            initial = stream.initial_state(spark, seeds)
            written = write_seeds(bootstrap, settings.kafka_client_config(), seeds)
            log.info(
                "ingest takes over from the micro-batch checkpoint at batch %d (%d marks)",
                committed.batch,
                written,
            )
    return stream.start(
        spark,
        settings.model_copy(update={"spark_checkpoint_dir": own}),
        pattern,
        realtime=realtime,
        limits=limits,
        retired=retired,
        initial=initial,
        counts=counts,
        starting=starting,
    )


class QueryInputs:
    """What the running query read when it started (:meth:`take`): the retired topics, the
    main topics' limits and, in real-time mode, the ingest topics' partitions.
    :meth:`changed` is True once any of them is no longer so: the query must start again."""

    def __init__(
        self,
        settings: Settings,
        pattern: str,
        limits: Callable[[], Mapping[str, int]],
        retired: Callable[[], Collection[str]],
    ) -> None:
        self._realtime = settings.ingest_mode == "real-time"
        self._admin = AdminClient(
            {"bootstrap.servers": settings.kafka_bootstrap or "", **settings.kafka_client_config()}
        )
        self._pattern = pattern
        self._matcher = re.compile(pattern)
        self._limits = limits
        self._retired = retired
        self._partitions: dict[str, int] = {}
        self._reading: frozenset[str] | None = None
        self._listed_at = float("-inf")
        self._at_start: tuple[Any, ...] = ()

    def take(self) -> None:
        self._listed_at = float("-inf")
        self._at_start = self._picture()
        self._reading = frozenset(self._partitions) if self._realtime else None

    def partitions(self) -> int:
        """The ingest partitions listed when the query started (real-time mode; else 0)."""
        return sum(self._partitions.values())

    def reading(self) -> Collection[str] | None:
        """In real-time mode, the ingest topics listed when the query started (it reads every
        partition it was started with); None otherwise."""
        return self._reading

    def changed(self) -> bool:
        return self._picture() != self._at_start

    def _picture(self) -> tuple[Any, ...]:
        if self._realtime and time.monotonic() - self._listed_at >= TOPICS_EVERY_S:
            try:
                self._partitions = ingest_partitions(self._admin, self._pattern)
            except KafkaException as exc:  # Kafka away: the query says so itself
                log.warning("could not list the ingest topics: %s", exc)
            self._listed_at = time.monotonic()
        return (
            # Only the retired topics this query reads matter to it (the list is everyone's).
            frozenset(t for t in self._retired() if self._matcher.fullmatch(t)),
            tuple(sorted(self._limits().items())),
            tuple(sorted(self._partitions.items())),
        )


def until_kafka_answers(
    work: Callable[[], object],
    stopping: threading.Event,
    patience_s: float = KAFKA_PATIENCE_S,
    pause_s: Callable[[int], float] = lambda tries: min(2.0**tries, 15.0),
) -> None:
    """Runs ``work`` (making the job's own topics), again while Kafka does not answer (a
    broker restarting as the job starts), up to ``patience_s``; then, or once ``stopping`` is
    set, raises the last failure. A job that exited at once was started again by its
    supervisor, but showed as a failure for what is only a wait."""
    deadline = time.monotonic() + patience_s
    tries = 0
    while True:
        try:
            work()
            return
        except (DependencyUnavailable, KafkaException) as exc:
            tries += 1
            pause = pause_s(tries)
            if time.monotonic() + pause > deadline:
                raise
            log.warning(
                "Kafka does not answer (%s); the ingest job asks again in %.0f s", exc, pause
            )
            if stopping.wait(pause):
                raise


class OperatorRun:
    """The driver's side of the operator's modes, for ``job.run``: makes the changelog, starts
    the marks follower and the counts and batch followers; :meth:`start_query` starts
    the query (again), :meth:`changed` says when it must, :meth:`stop` ends the helpers."""

    def __init__(
        self,
        spark: SparkSession,
        settings: Settings,
        publisher: MarkPublisher,
        metrics: IngestMetrics,
        pattern: str,
        limits: Callable[[], Mapping[str, int]],
        retired: Callable[[], Collection[str]],
        stopping: threading.Event,
    ) -> None:
        self._spark = spark
        self._settings = settings
        self._metrics = metrics
        self._pattern = pattern
        self._limits = limits
        self._retired = retired
        bootstrap = settings.kafka_bootstrap or ""
        client_config = settings.kafka_client_config()
        admin = KafkaTopics(
            bootstrap,
            replication_factor=settings.kafka_replication_factor,
            max_message_bytes=settings.max_message_bytes,
            client_config=client_config,
            shared_log=settings.shared_ingest_log_spec(),
        )
        until_kafka_answers(admin.ensure_producer_marks, stopping)
        until_kafka_answers(admin.ensure_shared_log, stopping)
        self._follower = MarksFollower(bootstrap, publisher, client_config, retired).start()
        self._counts = stream.topic_counts(spark)
        self._batches = BatchFollower(metrics)
        live = stream.live_counts(spark, self._counts)
        self._counter = CountsFollower(live, metrics, batches=self._batches).start()
        self._inputs = QueryInputs(settings, pattern, limits, retired)

    def start_query(self) -> StreamingQuery:
        self._inputs.take()
        realtime = self._settings.ingest_mode == "real-time"
        partitions = self._inputs.partitions()
        if realtime and partitions > self._settings.spark_realtime_max_partitions:
            # A task and a Kafka consumer per partition, all the time: past this many, the
            # job would spend its cores on them (docs/ingest.md, "Many topics").
            log.warning(
                "the ingest topics have %d partitions, more than SETU_SPARK_REALTIME_MAX_"
                "PARTITIONS (%d): the query runs in micro-batches until they are fewer",
                partitions,
                self._settings.spark_realtime_max_partitions,
            )
            realtime = False
        if realtime:
            self._check_slots(partitions)
        query = start_query(
            self._spark,
            self._settings,
            self._pattern,
            limits=self._limits,
            retired=self._retired,
            counts=self._counts,
            realtime=realtime,
        )
        self._metrics.watch(lambda: (query.isActive, query.lastProgress))
        self._batches.follow(query)
        log.info(
            "ingest query %s started in %s mode (%s)",
            query.id,
            "real-time" if realtime else "micro-batch",
            operator_checkpoint(self._settings),
        )
        return query

    def changed(self) -> bool:
        return self._inputs.changed()

    def batches(self) -> int:
        """Batches this process wrote, the running (or just failed) query's last ones counted
        now: ``job.keep_running`` asks after a failure whether one ended since the start."""
        try:
            self._batches.catch_up()
        except Exception:  # the JVM going away as the job stops
            log.debug("could not read the query's progress", exc_info=True)
        return self._metrics.batches()

    def _check_slots(self, partitions: int) -> None:
        """Raises when the real-time query could not get its slots: :class:`SlotsShort` on a
        local master (the session is built again, larger), a clear failure on a cluster, which
        ``job.keep_running`` retries like any failed start (an executor lost with its worker
        comes back; one that never does ends the job with this message)."""
        needed = slots_needed(self._settings, partitions)
        slots = self._spark.sparkContext.defaultParallelism
        if needed <= slots:
            return
        if is_local_master(self._settings.spark_master):
            raise SlotsShort(partitions, needed, slots)
        raise RuntimeError(
            f"real-time mode needs {needed} task slots ({partitions} ingest partitions and "
            f"{self._settings.spark_shuffle_partitions} shuffle partitions), and the cluster's "
            f"executors have {slots} cores: give them more cores, or set "
            f"SETU_INGEST_MODE=micro-batch"
        )

    def reading(self) -> Collection[str] | None:
        """The ingest topics the running query reads, in real-time mode (its progress comes
        only at a batch's end); None in micro-batches, where each batch's progress says."""
        return self._inputs.reading()

    def stop(self) -> None:
        self._counter.stop()
        self._follower.stop()
