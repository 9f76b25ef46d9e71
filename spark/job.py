"""The ingest job: every ``setu.*.ingest`` topic -> de-duplicated, ordered main logs.

One Structured Streaming query, Spark's own Kafka source and sink, and no shuffle:

1. Read every ingest topic by pattern (``setu.names.INGEST_PATTERN``); a topic created later is
   picked up at the next metadata refresh (``SETU_SPARK_TOPIC_REFRESH_MS``), from its first
   offset. The source gives each ingest partition's offset range of a batch to one task.
2. In each micro-batch (``foreachBatch``), each task de-duplicates its partition's rows
   (:mod:`spark.dedup`, in :class:`spark.processor.PartitionDedup`, a ``mapInPandas``) against
   the partition's marks, versioned by batch in the checkpoint (:mod:`spark.dedup_state`), and
   hands the kept rows on in ingest order.
3. The same task writes them with the Kafka sink as they come (a projection only: nothing
   could reorder them), through one idempotent producer (``acks=all``,
   ``enable.idempotence``, at most 5 requests in flight), so retries cannot reorder a
   partition; the sink's default partitioner is murmur2 on the key, as docs/design.md §1
   requires. Key = GroupId, else MessageId; headers are carried over plus
   ``setu-ingest-partition`` / ``setu-ingest-offset``. A group lives on one ingest partition,
   so its rows leave in ingest order.
4. After the write returns (every record acknowledged), raise the producers' high marks in Redis
   (:mod:`spark.marks`) and count the batch (:mod:`spark.metrics`); the dedup step gathers the
   marks and the per-topic counts in accumulators during the same pass. When Redis forgot the
   marks, a thread of the driver publishes them all again from the checkpoint within a second,
   batch or no batch (:class:`spark.marks.MarksKeeper`).

Crash safety. Spark commits a batch (its source offsets) only after ``foreachBatch`` returns.
A kill before that commit runs the batch again from the same offsets; each partition's task
starts again from the marks stored below the batch's id, and TTL is measured in record time,
so the dedup decisions, the rows and their order are exactly those of the first attempt: the
main log may hold the batch twice, as an exact replay (same message ids, same order) that the
delivery side recognises by its ingest offsets and skips (``delivery.replays``). Nothing
accepted is lost, because a batch is committed only after its write succeeded; marks are
max-guarded, so replays never lower them.

Latency. One stage per batch, no shuffle and no state store: docs/latency.md has the figures.
A checkpoint written by an earlier version of the job (its marks in Spark's state store) cannot
be resumed: :func:`check_checkpoint` says so before Spark starts.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import re
import signal
import sys
import threading
import time
import zipfile
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any
from urllib.parse import urlparse

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient
from opentelemetry.trace import SpanKind
from pyspark.accumulators import Accumulator
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as fn
from pyspark.sql.streaming.query import StreamingQuery
from pyspark.sql.types import StructType

from setu import logs, tracing
from setu.envelope import (
    H_PRODUCER_ID,
    H_SEQUENCE_ID,
    H_TOPIC_INCARNATION,
    H_TRACEPARENT,
)
from setu.limits import MessageLimits
from setu.names import (
    INGEST_PATTERN,
    INGEST_REJECTS_SUFFIX,
    INGEST_SUFFIX,
    ingest_topic,
    main_topic,
    parse_ingest_topic,
    parse_main_topic,
)
from setu.settings import Settings, is_local_master
from spark import operator_job
from spark.dedup import decode_marks
from spark.dedup_state import PartitionMarks
from spark.marks import (
    HighsParam,
    MarkPublisher,
    MarksKeeper,
    ProducerHighs,
    TopicMarks,
    by_topic,
    merge_highs,
)
from spark.metrics import (
    CountsParam,
    IngestMetrics,
    TopicCounts,
    TracesParam,
    WaitCounts,
    WaitsParam,
    no_waits,
)
from spark.migration import last_committed
from spark.processor import (
    INCARNATION,
    OFFSET,
    PARTITION,
    PRODUCER,
    RECORD_MS,
    SEQUENCE,
    TOPIC,
    TRACEPARENT,
    PartitionDedup,
)
from spark.rejects import routed_columns
from spark.status import Reading, StatusReporter
from spark.stream import ingest_position_headers, key_column
from spark.topics import MainTopicGuard
from state.ingest_status import RedisIngestStatus
from state.redis_clients import sync_redis
from state.retired_topics import RetiredTopics

log = logging.getLogger(__name__)

QUERY_NAME = "setu-ingest"
HEADERS_TYPE = "array<struct<key:string,value:binary>>"
# Anchored: the Kafka source matches the pattern anywhere in a topic name.
SUBSCRIBE_PATTERN = f"^{INGEST_PATTERN}$"
RAW_HEADERS, KEY, VALUE = "headers", "key", "value"
ROCKSDB_STATE_STORE = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
LOCAL_CHECKPOINT_FILE_MANAGER = (
    "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"
)

# The most a chunk of rows into the dedup step holds (docs/ingest.md, "Memory per batch"),
# give or take its last row: Spark closes a chunk at the first row that takes it past this.
ARROW_MAX_BATCH_BYTES = 32 * 1024 * 1024

# What the dedup step hands on: the sink's columns and the ingest position.
DEDUP_COLUMNS = [TOPIC, PARTITION, OFFSET, VALUE, RAW_HEADERS, KEY]


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
    ``ARROW_MAX_BATCH_BYTES``, and never more than Kafka's default of 500."""
    return max(1, min(500, ARROW_MAX_BATCH_BYTES // MessageLimits(max_message_bytes).record_bytes))


def session_config(settings: Settings) -> dict[str, str]:
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
        # A chunk of rows into the dedup step is bounded in bytes too, not only in rows (10,000
        # by default, i.e. 10 GB of records at the message limit): the step hands each chunk's
        # kept rows back before it reads the next, so neither side holds a batch at once.
        "spark.sql.execution.arrow.maxBytesPerBatch": str(ARROW_MAX_BATCH_BYTES),
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
    else:
        # Executors run the Python of their machine; the same interpreter path is the usual
        # case (one image for driver and executors), and SETU_SPARK_CONF can say otherwise.
        conf["spark.pyspark.python"] = sys.executable
    conf.update(operator_job.session_overrides(settings))
    conf.update(settings.spark_conf)
    return conf


# The packages the executors import (the dedup function and the accumulators' types).
SHIPPED_PACKAGES = ("setu", "spark", "state")


def ship_code(spark: SparkSession, folder: Path) -> Path:
    """Sends this job's own code to the executors of a cluster, so that they run exactly the
    driver's version of it (their Python needs Setu's dependencies, not Setu itself): a zip of
    :data:`SHIPPED_PACKAGES` written to ``folder``, added with ``addPyFile``."""
    folder.mkdir(parents=True, exist_ok=True)
    archive = folder / "setu-ingest.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as out:
        for name in SHIPPED_PACKAGES:
            package = Path(importlib.import_module(name).__path__[0])
            for source in sorted(package.rglob("*.py")):
                out.write(source, f"{name}/{source.relative_to(package)}")
    spark.sparkContext.addPyFile(str(archive))
    return archive


def is_local_path(path: str) -> bool:
    """True for a plain path or a ``file:`` URI; False for ``hdfs://``, ``s3a://`` and the like."""
    return urlparse(path).scheme in ("", "file")


def build_session(settings: Settings) -> SparkSession:
    """The job's session; on a cluster, with this job's code shipped to the executors."""
    builder = SparkSession.builder
    for key, value in session_config(settings).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    if not is_local_master(settings.spark_master):
        ship_code(spark, settings.data_dir.resolve() / "spark")
    return spark


def _bootstrap(settings: Settings) -> str:
    if not settings.kafka_bootstrap:
        raise ValueError("SETU_KAFKA_BOOTSTRAP is required by the ingest job")
    return settings.kafka_bootstrap


def with_identity(raw: DataFrame, traced: bool = False) -> DataFrame:
    """Source rows -> the columns the job works on, headers packed as JSON for the processor.

    The producer column is null unless both producer id and a valid sequence are present; the
    sequence column is -1 where there is no valid sequence, the incarnation column 0 where the
    record carries none (:mod:`spark.dedup`). ``traced`` adds each record's ``traceparent``
    (setu/tracing.py), for the batch span's links.
    """
    # One map per row, then plain lookups: far cheaper than a filter lambda per header name.
    header = fn.map_from_entries(fn.col(RAW_HEADERS))
    sequence = header[H_SEQUENCE_ID].cast("string").try_cast("bigint")
    producer = fn.when(sequence.isNotNull(), header[H_PRODUCER_ID].cast("string"))
    incarnation = header[H_TOPIC_INCARNATION].cast("string").try_cast("bigint")
    key = key_column(header)
    rows = raw.select(
        fn.col(TOPIC),
        fn.col(PARTITION),
        fn.col(OFFSET),
        fn.col(VALUE),
        # Pandas turns arrays of structs into Python objects row by row; a JSON string is cheap.
        fn.to_json(fn.col(RAW_HEADERS)).alias(RAW_HEADERS),
        key.alias(KEY),
        producer.alias(PRODUCER),
        fn.coalesce(sequence, fn.lit(-1).cast("bigint")).alias(SEQUENCE),
        fn.coalesce(incarnation, fn.lit(0).cast("bigint")).alias(INCARNATION),
        fn.unix_millis(fn.col("timestamp")).alias(RECORD_MS),
        *([header[H_TRACEPARENT].cast("string").alias(TRACEPARENT)] if traced else []),
    )
    return rows


def dedup_schema(rows: DataFrame) -> StructType:
    fields = {f.name: f for f in rows.schema.fields}
    return StructType([fields[name] for name in DEDUP_COLUMNS])


def source_rows(
    spark: SparkSession, settings: Settings, pattern: str = SUBSCRIBE_PATTERN
) -> DataFrame:
    """The streaming frame of ingest records, as :func:`with_identity` columns."""
    raw = spark.readStream.format("kafka").options(**source_options(settings, pattern)).load()
    return with_identity(raw, traced=tracing.current().enabled)


def marks_below(marks: PartitionMarks, batch_id: int, retired: Collection[str]) -> TopicMarks:
    """Every producer's mark as the batches before ``batch_id`` left them in the checkpoint,
    but those of ``retired`` ingest topics."""
    highs: ProducerHighs = {}
    for text in marks.all_below(batch_id):
        for (topic, producer), mark in decode_marks(text).items():
            if topic not in retired and mark.high >= 0:
                merge_highs(highs, {(topic, producer): (mark.incarnation, mark.high)})
    return by_topic(highs.items())


def committed_marks(checkpoint: str, retired: Collection[str]) -> TopicMarks:
    """Every producer's mark as the job's committed batches left them (none before its first
    commit), but those of ``retired`` ingest topics."""
    committed = last_committed(checkpoint)
    if committed is None:
        return {}
    return marks_below(PartitionMarks(checkpoint), committed.batch + 1, retired)


@dataclass(frozen=True, slots=True)
class Dedup:
    """What the batch writer needs to de-duplicate each batch (:class:`PartitionDedup`)."""

    marks: PartitionMarks
    ttl_ms: int
    max_producers: int
    highs: Accumulator[ProducerHighs]
    counts: Accumulator[TopicCounts]
    waits: Accumulator[WaitCounts]
    tasks: int = 0
    """Tasks a batch's de-duplication runs in (0: as many as the source has partitions)."""
    traces: Accumulator[list[str]] | None = None
    """The traceparents of a batch's first messages, when tracing (setu/tracing.py)."""

    def accepted(self, rows: DataFrame, batch_id: int, started_ms: int) -> DataFrame:
        """The batch's rows that are not duplicates, each task's in ingest order."""
        function = PartitionDedup(
            batch_id,
            self.marks,
            self.ttl_ms,
            self.max_producers,
            DEDUP_COLUMNS,
            self.highs,
            self.counts,
            self.waits,
            started_ms,
            self.traces,
        )
        # Fewer, larger tasks: each Python task costs a fixed handful of ms, and a coalesce
        # keeps each source partition whole, in order, in one task.
        if self.tasks:
            rows = rows.coalesce(self.tasks)
        return rows.mapInPandas(function, schema=dedup_schema(rows))

    def everything(self, batch_id: int, retired: frozenset[str]) -> TopicMarks:
        """Every producer's mark as the batches before ``batch_id`` left them (the checkpoint
        holds them), but those of ``retired`` ingest topics: what Redis must hold."""
        return marks_below(self.marks, batch_id, retired)

    def reset(self) -> None:
        """Empties the accumulators before a batch is computed (again)."""
        self.highs.value = {}
        self.counts.value = {}
        self.waits.value = no_waits()
        if self.traces is not None:
            self.traces.value = []


def new_dedup(spark: SparkSession, settings: Settings) -> Dedup:
    return Dedup(
        PartitionMarks(settings.resolved_checkpoint_dir()),
        settings.dedup_ttl_seconds * 1000,
        settings.dedup_max_producers,
        spark.sparkContext.accumulator({}, HighsParam()),
        spark.sparkContext.accumulator({}, CountsParam()),
        spark.sparkContext.accumulator(no_waits(), WaitsParam()),
        settings.spark_dedup_tasks or spark.sparkContext.defaultParallelism,
        spark.sparkContext.accumulator([], TracesParam()) if tracing.current().enabled else None,
    )


def main_log_columns() -> list[Column]:
    """Accepted rows as Kafka sink rows: a projection only, so each task keeps its row order.
    The columns hold no data frame, so one list serves every batch."""
    raw = fn.from_json(fn.col(RAW_HEADERS), HEADERS_TYPE)
    headers = fn.concat(raw, ingest_position_headers())
    return [
        fn.regexp_replace(TOPIC, re.escape(INGEST_SUFFIX) + "$", "").alias("topic"),
        fn.col(KEY).alias("key"),
        fn.col(VALUE).alias("value"),
        headers.alias("headers"),
    ]


# Failed query starts in a row (no batch written in between) before the job gives up.
QUERY_RESTARTS = 12  # with the pauses of keep_running: about five minutes
# How long a batch's write is tried again before the batch (and so the query) fails.
WRITE_PATIENCE_S = 300.0


def batch_span(
    batch_id: int, started_ns: int, counts: Mapping[str, tuple[int, int]], traces: list[str]
) -> None:
    """The ``ingest batch`` span of a written batch, linked to its first messages' traces."""
    attributes = {
        "setu.ingest.batch_id": batch_id,
        "setu.ingest.accepted": sum(accepted for accepted, _ in counts.values()),
        "setu.ingest.duplicates": sum(dropped for _, dropped in counts.values()),
    }
    with tracing.span(
        tracing.current(),
        "ingest batch",
        SpanKind.INTERNAL,
        attributes=attributes,
        links=tracing.links_to(traces),
        start_ns=started_ns,
    ):
        pass


class BatchWriter:
    """The ``foreachBatch`` function: write the main logs (setting aside, in the same write,
    the rows a main topic can never take: :mod:`spark.rejects`), then raise the producer
    marks and count the batch.

    Rows of a topic deleted through the API are not written: its ingest topic is retired
    (``state.retired_topics``, read at every batch). A write that fails because a topic went
    away meanwhile is written again without the rows of topics that are gone (retired, or
    both ingest and main topics missing). Any other failure (the broker restarting, say) is
    tried again after a pause, for up to ``WRITE_PATIENCE_S``. A write again repeats what the
    failed one wrote: an exact replay, in order, that delivery skips by ingest offset
    (``delivery.replays``), as after a crash.
    """

    def __init__(
        self,
        settings: Settings,
        dedup: Dedup,
        publisher: MarkPublisher,
        metrics: IngestMetrics,
        limits: Callable[[], Mapping[str, int]] = dict,
        retired: Callable[[], frozenset[str]] = frozenset,
    ) -> None:
        """``limits`` tells the main topics' current ``max.message.bytes`` (spark.topics),
        ``retired`` the ingest topics of deleted topics (state.retired_topics)."""
        self._options = sink_options(settings)
        self._dedup = dedup
        self._publisher = publisher
        self._metrics = metrics
        # The sink's own limit, less a request's framing: no row above it is sent to Kafka.
        self._default_limit = MessageLimits(settings.max_message_bytes).topic_bytes
        self._limits = limits
        self._retired = retired
        self._bootstrap = _bootstrap(settings)
        self._client_config = settings.kafka_client_config()
        # The sink's columns, built once (and again when the main topics' limits change).
        self._columns: tuple[Mapping[str, int], list[Column], list[Column]] | None = None

    def _sink_rows(self, accepted: DataFrame) -> DataFrame:
        """The accepted rows as the sink writes them (:func:`main_log_columns`, then
        :func:`spark.rejects.routed_columns`)."""
        limits = self._limits()
        if self._columns is None or self._columns[0] != limits:
            self._columns = (
                dict(limits),
                main_log_columns(),
                routed_columns(limits, self._default_limit),
            )
        _, main, routing = self._columns
        return accepted.select(*main).select(*routing)

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        started, started_ns = time.monotonic(), time.time_ns()
        accepted = self._dedup.accepted(batch, batch_id, int(time.time() * 1000))
        retired = self._retired()
        rows = self._sink_rows(accepted)
        self._write(rows, batch_id, {main_topic(*parse_ingest_topic(t)) for t in retired})
        dedup = self._dedup
        highs = [
            (owner, mark) for owner, mark in dedup.highs.value.items() if owner[0] not in retired
        ]
        self._publisher.publish(
            by_topic(highs), lambda: dedup.everything(batch_id, frozenset(retired))
        )
        self._metrics.batch_written(
            dedup.counts.value, time.monotonic() - started, dedup.waits.value
        )
        if dedup.traces is not None:
            batch_span(batch_id, started_ns, dedup.counts.value, dedup.traces.value)

    def _write(self, rows: DataFrame, batch_id: int, retired: set[str]) -> None:
        """Writes the batch without the rows of ``retired`` main topics; a failed write is
        tried again (see the class doc), without the topics deleted meanwhile, for up to
        ``WRITE_PATIENCE_S`` before the batch fails."""
        deadline = time.monotonic() + WRITE_PATIENCE_S
        main = fn.regexp_replace("topic", re.escape(INGEST_REJECTS_SUFFIX) + "$", "")
        kept, pause = (rows.where(~main.isin(*retired)) if retired else rows), 1.0
        while True:
            # Every attempt computes the rows again (same state version, same decisions).
            self._dedup.reset()
            try:
                kept.write.format("kafka").options(**self._options).save()
                return
            except Exception as exc:
                cause = root_cause(exc)
                gone = self._deleted_in(rows, main) | retired
                if gone:
                    log.warning(
                        "batch %d: topics %s were deleted while their messages were being "
                        "written (%s); writing the batch again without them",
                        batch_id,
                        ", ".join(sorted(gone)),
                        cause,
                    )
                    kept = rows.where(~main.isin(*gone))
                    continue
                if time.monotonic() + pause > deadline:
                    raise
                log.warning(
                    "batch %d: writing failed (%s); trying again in %.0f s", batch_id, cause, pause
                )
                time.sleep(pause)
                pause = min(pause * 2, 30.0)

    def _deleted_in(self, rows: DataFrame, main: Column) -> set[str]:
        """The main topics of ``rows`` deleted through the API; none while Kafka is away."""
        try:
            in_batch = [row[0] for row in rows.select(main).distinct().collect()]
            return deleted_topics(self._bootstrap, in_batch, self._client_config)
        except Exception as exc:  # the broker restarting, say: the write is tried again
            log.warning("could not tell which topics are gone: %s", root_cause(exc))
            return set()


def deleted_topics(
    bootstrap: str, main_topics: Iterable[str], client_config: Mapping[str, str] | None = None
) -> set[str]:
    """Those of ``main_topics`` whose main and ingest topics are both gone now."""
    admin = AdminClient({"bootstrap.servers": bootstrap, **(client_config or {})})
    listed = set(admin.list_topics(timeout=10).topics)
    gone = set()
    for main in main_topics:
        if main not in listed and ingest_topic(*parse_main_topic(main)) not in listed:
            gone.add(main)
    return gone


class CheckpointLayoutError(RuntimeError):
    """The checkpoint holds de-duplication state this job cannot read."""


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
    every ingest topic."""
    return pattern or settings.spark_ingest_pattern or SUBSCRIBE_PATTERN


def start(
    spark: SparkSession,
    settings: Settings,
    publisher: MarkPublisher,
    pattern: str | None = None,
    metrics: IngestMetrics | None = None,
    limits: Callable[[], Mapping[str, int]] = dict,
    retired: Callable[[], frozenset[str]] = frozenset,
) -> StreamingQuery:
    """Start the query; it resumes from the checkpoint if one exists.

    It reads the topics matching ``pattern``, else ``settings.spark_ingest_pattern``, else
    every ingest topic. ``metrics`` (if given) counts its batches and watches it; ``limits``
    tells the main topics' ``max.message.bytes`` (:meth:`MainTopicGuard.limits`), ``retired``
    the ingest topics of deleted topics (:class:`state.retired_topics.RetiredTopics`).
    """
    pattern = ingest_pattern(settings, pattern)
    metrics = metrics or IngestMetrics()
    dedup = new_dedup(spark, settings)
    query = (
        source_rows(spark, settings, pattern)
        .writeStream.queryName(QUERY_NAME)
        .foreachBatch(BatchWriter(settings, dedup, publisher, metrics, limits, retired))
        .option("checkpointLocation", settings.resolved_checkpoint_dir())
        .trigger(processingTime=f"{settings.spark_trigger_ms} milliseconds")
        .start()
    )
    metrics.watch(lambda: (query.isActive, query.lastProgress))
    return query


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
        query = start_query()
        reporter.set_state("starting")
        reporter.watch(_progress_of(query), reading)
        before = batches()
        try:
            restart = False
            while not stopping.is_set() and query.isActive:
                query.awaitTermination(1)
                if stale():
                    restart = True
                    break
            stop_between_batches(query, stop_patience_s)
            if restart and not stopping.is_set():
                log.info("ingest query %s starts again: the topics it reads changed", query.id)
                continue
            return
        except Exception as exc:
            if stopping.is_set():
                raise
            # A batch written since the last start: the failure is not a standing one.
            failures = 1 if batches() > before else failures + 1
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


def run(settings: Settings) -> None:
    """Run the job until SIGTERM/SIGINT (stops the query cleanly). A failed query is started
    again from its checkpoint in this process (the JVM stays warm, and a broker or Redis
    restart does not stop the job); after ``QUERY_RESTARTS`` failures in a row without a
    batch written in between, the job exits with the failure's root cause as its last line."""
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
    # What runs beside the query, stopped in reverse order at the end.
    helpers: list[Callable[[], None]] = []
    reporter = StatusReporter(RedisIngestStatus(client), metrics.last_batch_at).start()
    spark = build_session(settings)
    end_state = "stopped"
    try:
        if settings.ingest_metrics_port is not None:
            server = metrics.serve(settings.ingest_metrics_host, settings.ingest_metrics_port)
            helpers.append(server.shutdown)
            log.info(
                "metrics at http://%s:%d/metrics", settings.ingest_metrics_host, server.server_port
            )
        retired = RetiredTopics(client)
        guard = MainTopicGuard(
            _bootstrap(settings),
            ingest_pattern(settings),
            client_config=settings.kafka_client_config(),
            on_recreated=metrics.main_topic_recreated,
            retired=retired,
        ).start()
        helpers.append(guard.stop)
        metrics.watch_rejects(guard.rejects)
        publisher = MarkPublisher(client)
        if operator_job.uses_operator(settings):
            # The query reads the limits once, at its start: known before it, not 5 s later.
            with contextlib.suppress(KafkaException):
                guard.check()
            pattern = ingest_pattern(settings)
            running = operator_job.OperatorRun(
                spark, settings, publisher, metrics, pattern, guard.limits, retired
            )
            helpers.append(running.stop)
            keep_running(
                running.start_query,
                stopping,
                reporter,
                metrics.batches,
                stale=running.changed,
                stop_patience_s=0 if settings.ingest_mode == "real-time" else 30,
                reading=running.reading,
            )
            return
        checkpoint = settings.resolved_checkpoint_dir()
        keeper = MarksKeeper(publisher, lambda: committed_marks(checkpoint, retired())).start()
        helpers.append(keeper.stop)

        def start_query() -> StreamingQuery:
            query = start(
                spark, settings, publisher, metrics=metrics, limits=guard.limits, retired=retired
            )
            log.info("ingest query %s started (%s)", query.id, settings.resolved_checkpoint_dir())
            return query

        keep_running(start_query, stopping, reporter, metrics.batches)
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
        for stop in reversed(helpers):
            stop()
        client.close()
        try:
            spark.stop()
        except Exception:
            if not stopping.is_set():
                raise
        for sig, handler in previous.items():
            signal.signal(sig, handler)
