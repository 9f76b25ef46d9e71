"""``setu ingest``: every ``setu.*.ingest`` topic -> de-duplicated, ordered main logs.

One Structured Streaming query (:mod:`spark.stream`), Spark's own Kafka source and sink, with the
de-duplication rule as a JVM stateful operator grouped by ingest (topic, partition) (decision
0008, docs/ingest.md). It runs in Spark's real-time mode by default (``SETU_INGEST_MODE``,
decision 0009): each record goes on as it arrives, and a batch only says how often the query
checkpoints (``SETU_SPARK_REALTIME_BATCH_S``); ``micro-batch`` runs the same query, the same
operator, in micro-batches. :mod:`spark.operator_job` holds what the driver does beside it.

This module holds the Kafka and Spark settings of the query, and the loop that keeps it running:
a failed query (a broker or Redis restarting, a write that failed) starts again from its
checkpoint in the same process, and so does a query whose inputs changed (a topic deleted, a
main topic's size limit changed, in real-time mode a new ingest topic or partition).

Crash safety. The query commits a batch (its source offsets and the operator's state) only after
every record the batch wrote was acknowledged. A kill before that runs the batch again from the
same offsets and the same state, so the decisions and their order are those of the first run:
the main log may hold a stretch twice, as an exact replay (same message ids, same order) that
delivery recognises by its ingest offsets and skips (``delivery.replays``). Nothing accepted is
lost; producer marks are max-guarded, so replays never lower them.
"""

from __future__ import annotations

import contextlib
import json
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any
from urllib.parse import urlparse

import redis
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient
from py4j.protocol import Py4JNetworkError
from pyspark.sql import SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from setu import logs
from setu.limits import MessageLimits
from setu.names import INGEST_PATTERN, with_shared_log
from setu.settings import Settings, is_local_master
from spark import operator_job
from spark.marks import MarkPublisher
from spark.metrics import IngestMetrics
from spark.status import Reading, StatusReporter
from spark.topics import MainTopicGuard
from state.ingest_status import RedisIngestStatus, StubIngestStatus
from state.redis_clients import sync_redis
from state.retired_topics import RetiredTopics

log = logging.getLogger(__name__)

QUERY_NAME = "setu-ingest"
# Anchored: the Kafka source matches the pattern anywhere in a topic name.
SUBSCRIBE_PATTERN = f"^{INGEST_PATTERN}$"
ROCKSDB_STATE_STORE = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
LOCAL_CHECKPOINT_FILE_MANAGER = (
    "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"
)

# The most one poll of the source holds in the heap, decompressed, give or take its last record
# (docs/ingest.md, "Memory"): the poll's record count is bounded by it.
POLL_MAX_BYTES = 32 * 1024 * 1024


def sink_options(settings: Settings) -> dict[str, str]:
    """Kafka producer settings of the sink: durable, and ordered under retries."""
    return {
        "kafka.bootstrap.servers": _bootstrap(settings),
        # SASL and TLS as every other client of Setu (docs/security.md §8).
        **settings.kafka_security().spark_options(),
        "kafka.acks": "all",
        "kafka.enable.idempotence": "true",
        # Idempotence keeps order across retries for up to 5 requests in flight.
        "kafka.max.in.flight.requests.per.connection": "5",
        "kafka.linger.ms": "5",
        "kafka.batch.size": str(256 * 1024),
        # Whatever the API accepted fits (setu.limits): the client's default of 1 MiB did not
        # take a body at the limit with its headers, and the job replayed that batch forever.
        "kafka.max.request.size": str(MessageLimits(settings.max_message_bytes).request_bytes),
        # A main topic that is gone fails the write in 10 s instead of a minute.
        "kafka.max.block.ms": "10000",
    }


def project_pattern(project: str) -> str:
    """A subscribe pattern for the ingest topics of one project only (tests, benchmarks)."""
    return f"^setu\\.{project}\\.[a-z0-9-]+\\.ingest$"


def source_options(settings: Settings, pattern: str = SUBSCRIBE_PATTERN) -> dict[str, str]:
    return {
        "kafka.bootstrap.servers": _bootstrap(settings),
        **settings.kafka_security().spark_options(),
        "subscribePattern": pattern,
        "startingOffsets": "earliest",
        "includeHeaders": "true",
        "maxOffsetsPerTrigger": str(settings.spark_max_offsets_per_trigger),
        "kafka.metadata.max.age.ms": str(settings.spark_topic_refresh_ms),
        # A consumer pipelines its next fetch; on a quiet partition the broker parks that fetch
        # for fetch.max.wait.ms (500 by default), and the next batch's task waits it out first.
        "kafka.fetch.max.wait.ms": "10",
        # A deleted topic must not stop every other topic's ingest.
        "failOnDataLoss": "false",
        # One poll's records are held in the heap at once, decompressed: bounded in bytes by
        # their count, since fetch sizes count compressed bytes (docs/ingest.md).
        "kafka.max.poll.records": str(poll_records(settings.max_message_bytes)),
    }


def poll_records(max_message_bytes: int) -> int:
    """Records one poll of the source may return: as many of the largest record as fit in
    ``POLL_MAX_BYTES``, and never more than Kafka's default of 500."""
    return max(1, min(500, POLL_MAX_BYTES // MessageLimits(max_message_bytes).record_bytes))


def session_config(settings: Settings, partitions: int = 0) -> dict[str, str]:
    """The session's Spark properties; ``partitions``: the ingest partitions the real-time
    query will read, which size a local master (:func:`operator_job.local_slots`)."""
    conf = {
        "spark.master": settings.spark_master,
        "spark.app.name": QUERY_NAME,
        "spark.sql.shuffle.partitions": str(settings.spark_shuffle_partitions),
        "spark.ui.showConsoleProgress": "false",
        # Batches only when data arrives: TTL expiry is lazy, so empty batches buy nothing.
        "spark.sql.streaming.noDataMicroBatches.enabled": "false",
        "spark.sql.session.timeZone": "UTC",
        # Kafka allows a header name twice; building the lookup map must not fail on that.
        "spark.sql.mapKeyDedupPolicy": "LAST_WIN",
        # Each micro-batch is small: planning it adaptively costs more than it saves, and
        # waiting for a "better" executor only adds latency (state stores load fast locally).
        "spark.sql.adaptive.enabled": "false",
        "spark.locality.wait": "0s",
        # The de-duplication operator (spark/stream.py) keeps its state in RocksDB, the only
        # store Spark's transformWithState runs on.
        "spark.sql.streaming.stateStore.providerClass": ROCKSDB_STATE_STORE,
    }
    if is_local_path(settings.resolved_checkpoint_dir()):
        # Hadoop's FileContext rename on the local file system forks a `readlink` process per
        # file and per checksum file. Spark's FileSystem-based manager renames in place (atomic
        # on a local disk): measured at 720 -> 490 ms per small batch, same files on disk.
        conf["spark.sql.streaming.checkpointFileManagerClass"] = LOCAL_CHECKPOINT_FILE_MANAGER
    if settings.spark_jars:
        conf["spark.jars"] = settings.spark_jars
    if is_local_master(settings.spark_master):
        conf["spark.ui.enabled"] = "false"
    conf.update(operator_job.session_overrides(settings, partitions))
    conf.update(settings.spark_conf)
    return conf


def is_local_path(path: str) -> bool:
    """True for a plain path or a ``file:`` URI; False for ``hdfs://``, ``s3a://`` and the like."""
    return urlparse(path).scheme in ("", "file")


def build_session(settings: Settings, partitions: int | None = None) -> SparkSession:
    """The job's session, a local master sized for ``partitions`` ingest partitions (by
    default, those there are now). No Python runs on the executors: every step of the query is
    a column expression or the JVM operator, so a cluster's executors need only Spark and the
    jars."""
    if partitions is None:
        partitions = ingest_partition_count(settings)
    builder = SparkSession.builder
    for key, value in session_config(settings, partitions).items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def ingest_partition_count(settings: Settings) -> int:
    """The partitions of the ingest topics the job reads now; 0 outside real-time mode, or
    when Kafka does not answer (the query's start tells, :class:`operator_job.SlotsShort`)."""
    if settings.ingest_mode != "real-time" or not settings.kafka_bootstrap:
        return 0
    admin = AdminClient(
        {"bootstrap.servers": settings.kafka_bootstrap, **settings.kafka_client_config()}
    )
    try:
        listed = operator_job.ingest_partitions(admin, ingest_pattern(settings))
    except KafkaException as exc:
        log.warning("could not count the ingest partitions: %s", exc)
        return 0
    return sum(listed.values())


def _bootstrap(settings: Settings) -> str:
    if not settings.kafka_bootstrap:
        raise ValueError("SETU_KAFKA_BOOTSTRAP is required by the ingest job")
    return settings.kafka_bootstrap


# Failed query starts in a row (no batch committed in between, each failing within STEADY_S)
# before the job gives up.
QUERY_RESTARTS = 12  # with the pauses of keep_running: about five minutes
STEADY_S = 60.0


class CheckpointLayoutError(RuntimeError):
    """The checkpoint holds de-duplication state this job cannot read."""


def failures_after(exc: BaseException, failures: int, progressed: bool) -> int:
    """The standing failures in a row once the query failed with ``exc``: one after a query
    that committed a batch or ran a while; unchanged when the cluster lost an executor (a
    worker died: its churn, not a fault of the query; counting it ended the job when workers
    died faster than a 30 s batch could commit, in the 30-minute crash test in cluster mode)."""
    if progressed:
        return 1
    if lost_an_executor(exc):
        return max(1, min(failures, QUERY_RESTARTS))
    return failures + 1


def lost_an_executor(exc: BaseException) -> bool:
    """Whether a query failed because the cluster lost an executor (a worker died or was
    disconnected), not because of what the query did."""
    return "ExecutorLostFailure" in str(exc)


def jvm_gone(exc: BaseException) -> bool:
    """Whether ``exc`` says the driver's JVM is gone: Py4J lost its connection to it."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, Py4JNetworkError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def root_cause(exc: BaseException, limit: int = 500) -> str:
    """The innermost exception's line of a Spark error, not the query plan it carries."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    causes = [line for line in lines if "Exception:" in line or "Error:" in line]
    found = causes[-1] if causes else (lines[0] if lines else type(exc).__name__)
    return found[:limit]


def check_checkpoint(checkpoint: str) -> None:
    """Refuses, with what to do, a local checkpoint that holds Spark state-store state: an
    earlier version of this job kept its de-duplication marks there, and this one keeps them
    in ``dedup/`` (:mod:`spark.dedup_state`), so resuming it would forget every mark.

    Spark would not fail on it at all: the old state would just no longer be read.
    """
    if not is_local_path(checkpoint):
        return
    folder = Path(urlparse(checkpoint).path) / "state" / "0" / "_metadata"
    # v1 metadata (applyInPandasWithState) or the v2 files of transformWithState operators.
    versions = folder / "v2"
    found = [folder / "metadata"] if (folder / "metadata").is_file() else []
    if versions.is_dir():
        batches = [f for f in versions.iterdir() if f.name.isdigit()]
        found += sorted(batches, key=lambda f: int(f.name))[-1:]
    for metadata in found:
        try:
            operator = json.loads(metadata.read_text().splitlines()[1])["operatorInfo"]
            name = operator["operatorName"]
        except (OSError, IndexError, KeyError, TypeError, ValueError) as exc:
            raise CheckpointLayoutError(f"cannot read {metadata}: {exc}") from exc
        raise CheckpointLayoutError(
            f"the checkpoint at {checkpoint} holds the state of {name!r}, written by an "
            f"earlier version of the ingest job, and cannot be resumed: stop `setu ingest`, "
            f"remove the directory and start the job again (README: Operations)"
        )


def ingest_pattern(settings: Settings, pattern: str | None = None) -> str:
    """The ingest topics to read: ``pattern``, else ``settings.spark_ingest_pattern``, else
    every topic's own ingest topic, and the shared ingest log when ``SETU_INGEST_LOG=shared``
    (the topics' own ones still, for what was produced to them before a switch: decision
    0010)."""
    chosen = pattern or settings.spark_ingest_pattern
    if chosen:
        return chosen
    return with_shared_log(SUBSCRIBE_PATTERN, settings.shared_ingest_log())


def stop_between_batches(query: StreamingQuery, patience_s: float = 30.0) -> None:
    """Stop ``query``, letting a running batch finish first (a stop interrupts it otherwise)."""
    deadline = time.monotonic() + patience_s
    try:
        while query.isActive and query.status["isTriggerActive"] and time.monotonic() < deadline:
            time.sleep(0.05)
        if query.isActive:
            query.stop()
    except Exception:
        log.warning("ingest query could not be stopped cleanly", exc_info=True)


def keep_running(
    start_query: Callable[[], StreamingQuery],
    stopping: threading.Event,
    reporter: StatusReporter,
    batches: Callable[[], int],
    backoff: Callable[[int], float] = lambda failures: min(2.0**failures, 30.0),
    stale: Callable[[], bool] = lambda: False,
    stop_patience_s: float = 30.0,
    reading: Reading = lambda: None,
) -> None:
    """Runs the query until ``stopping`` is set, starting it again after a failure (see
    :func:`run`), and when ``stale`` says that what it read at its start changed; raises the
    failure once it stood ``QUERY_RESTARTS`` starts in a row. ``reading`` says which ingest
    topics the running query reads, when its progress cannot (see ``StatusReporter.watch``)."""
    failures = 0
    while True:
        before, started = batches(), time.monotonic()
        try:
            # A start can fail too (a cluster whose executors are not back yet): retried alike.
            query = start_query()
            reporter.set_state("starting")
            reporter.watch(_progress_of(query), reading)
            restart = False
            while not stopping.is_set() and query.isActive:
                query.awaitTermination(1)
                if stale():
                    restart = True
                    break
            if not restart and not stopping.is_set():
                # It ended between awaitTermination's timeout and the look at isActive: a
                # failure like any other, not the end of the job (which then exited 0 and
                # stopped ingest: the crash test in cluster mode saw it when a worker died).
                raise query.exception() or RuntimeError("the ingest query stopped on its own")
            stop_between_batches(query, stop_patience_s)
            if restart and not stopping.is_set():
                log.info("ingest query %s starts again: the topics it reads changed", query.id)
                continue
            return
        except operator_job.SlotsShort:
            raise  # the session is built again, larger (run)
        except Exception as exc:
            if stopping.is_set() or jvm_gone(exc):
                # No query can start on a JVM that died (killed for memory, say): the process
                # exits, and its supervisor starts a new one, at once rather than after every
                # restart in a row failed (five minutes, the pod not serving all along).
                raise
            # A batch committed since the last start, or a query that ran a while (a real-time
            # batch lasts SETU_SPARK_REALTIME_BATCH_S): the failure is not a standing one.
            progressed = batches() > before or time.monotonic() - started >= STEADY_S
            failures = failures_after(exc, failures, progressed)
            if failures > QUERY_RESTARTS:
                raise
            cause = root_cause(exc)
            reporter.set_state("failed", error=cause)
            pause = backoff(failures)
            log.error("ingest query failed (%s); starting it again in %.0f s", cause, pause)
            if stopping.wait(pause):
                return


def _progress_of(query: StreamingQuery) -> Callable[[], tuple[bool, Any]]:
    return lambda: (query.isActive, query.lastProgress)


def serve(
    spark: SparkSession,
    settings: Settings,
    client: redis.Redis[bytes],
    stopping: threading.Event,
    metrics: IngestMetrics,
    reporter: StatusReporter,
) -> None:
    """Runs the ingest query on ``spark`` with what runs beside it (the main topic guard, the
    producer marks follower, the counts follower: :class:`operator_job.OperatorRun`) until
    ``stopping`` is set; raises the query's failure once :func:`keep_running` gives up."""
    # What runs beside the query, stopped in reverse order at the end.
    helpers: list[Callable[[], None]] = []
    try:
        retired = RetiredTopics(client)
        guard = MainTopicGuard(
            _bootstrap(settings),
            ingest_pattern(settings),
            client_config=settings.kafka_client_config(),
            on_recreated=metrics.main_topic_recreated,
            retired=retired,
            seen=metrics.topics_seen,
        ).start()
        helpers.append(guard.stop)
        metrics.watch_rejects(guard.rejects)
        # The query reads the limits once, at its start: known before it, not 5 s later.
        with contextlib.suppress(KafkaException):
            guard.check()
        running = operator_job.OperatorRun(
            spark,
            settings,
            MarkPublisher(client),
            metrics,
            ingest_pattern(settings),
            guard.limits,
            retired,
            stopping,
        )
        helpers.append(running.stop)
        keep_running(
            running.start_query,
            stopping,
            reporter,
            running.batches,
            stale=running.changed,
            # A real-time batch lasts SETU_SPARK_REALTIME_BATCH_S: it is not waited for, and
            # what it wrote is replayed (and skipped by delivery) after the next start.
            stop_patience_s=0 if settings.ingest_mode == "real-time" else 30,
            reading=running.reading,
        )
    finally:
        for stop in reversed(helpers):
            stop()


@contextlib.contextmanager
def serving(
    spark: SparkSession,
    settings: Settings,
    client: redis.Redis[bytes],
    metrics: IngestMetrics | None = None,
) -> Iterator[IngestMetrics]:
    """:func:`serve` on a thread of its own while the block runs (tests and benchmarks, on a
    session they share), with an in-memory status; a failure of the job is raised at the end."""
    metrics = metrics or IngestMetrics()
    reporter = StatusReporter(StubIngestStatus(), metrics.last_batch_at)
    stopping = threading.Event()
    failures: list[BaseException] = []

    def main() -> None:
        try:
            serve(spark, settings, client, stopping, metrics, reporter)
        except BaseException as exc:
            failures.append(exc)

    thread = threading.Thread(target=main, name="ingest-job")
    thread.start()
    try:
        yield metrics
    finally:
        stopping.set()
        thread.join(120)
    if thread.is_alive():
        raise RuntimeError("the ingest job did not stop within 120 s")
    if failures:
        raise failures[0]


def run(settings: Settings) -> None:
    """Run the job until SIGTERM/SIGINT (stops the query cleanly). A failed query is started
    again from its checkpoint in this process (the JVM stays warm, and a broker or Redis
    restart does not stop the job); after ``QUERY_RESTARTS`` failures in a row, each within
    ``STEADY_S`` of its start and with no batch committed in between, the job exits with the
    failure's root cause as its last line."""
    if not settings.redis_url:
        raise ValueError("SETU_REDIS_URL is required by the ingest job")
    logs.configure(settings.log_level)
    check_checkpoint(settings.resolved_checkpoint_dir())  # before Spark takes its seconds
    stopping = threading.Event()

    def request_stop(signum: int, frame: FrameType | None) -> None:
        stopping.set()

    previous = {s: signal.signal(s, request_stop) for s in (signal.SIGTERM, signal.SIGINT)}
    client = sync_redis(settings, settings.redis_url)
    metrics = IngestMetrics()
    reporter = StatusReporter(RedisIngestStatus(client), metrics.last_batch_at).start()
    server = None
    spark = build_session(settings)
    end_state = "stopped"
    try:
        if settings.ingest_metrics_port is not None:
            server = metrics.serve(settings.ingest_metrics_host, settings.ingest_metrics_port)
            log.info(
                "metrics at http://%s:%d/metrics", settings.ingest_metrics_host, server.server_port
            )
        while True:
            try:
                serve(spark, settings, client, stopping, metrics, reporter)
                break
            except operator_job.SlotsShort as short:
                # More ingest partitions than the local master has threads for: a larger one.
                log.info("%s: starting Spark again with more", short)
                spark.stop()
                spark = build_session(settings, short.partitions)
    except Exception as exc:
        # A signal sent to the whole process group also takes down the JVM under the query;
        # the checkpoint makes that as safe as a clean stop. Any other failure is fatal.
        if not stopping.is_set():
            end_state = "failed"
            cause = root_cause(exc)
            reporter.set_state("failed", error=cause)
            log.exception("ingest query failed")
            # Last, so that the end of the log (what `setu dev up` shows) says why.
            log.error("ingest job failed: %s", cause)
            raise SystemExit(1) from None
        log.warning("Spark went down with the stop signal; the next start resumes")
    finally:
        reporter.stop(end_state)
        if server is not None:
            server.shutdown()
        client.close()
        try:
            spark.stop()
        except Exception:
            if not stopping.is_set():
                raise
        for sig, handler in previous.items():
            signal.signal(sig, handler)
