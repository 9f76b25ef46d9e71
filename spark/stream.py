"""The ingest query through the JVM de-duplication operator (decision 0008), for real-time mode.

    ingest topics --Kafka source--> operator columns --IngestDedup (JVM, per ingest partition)-->
        kept records --> main logs (or reject topics)
        their marks  --> the producer marks changelog (``MARKS_TOPIC``)

No ``foreachBatch``: real-time mode refuses it, and a record must not wait for a batch's end.
Everything the batch function did is either a column expression here (routing to the main log
or its reject topic, the ingest headers) or is done beside the query by the driver: retired
topics are filtered out when the query starts, and the producer marks reach Redis from the
changelog the query writes (:mod:`spark.marks_changelog`).

The same query runs in micro-batches when real-time mode is off (``trigger``), with the same
operator, so the rule has one home whichever way the job runs.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as fn
from pyspark.sql.streaming.query import StreamingQuery

from setu.envelope import (
    H_DEDUP_WINDOW,
    H_GROUP_ID,
    H_INGEST_LOG,
    H_INGEST_OFFSET,
    H_INGEST_PARTITION,
    H_MESSAGE_ID,
    H_PRODUCER_ID,
    H_SEQUENCE_ID,
    H_TOPIC,
    H_TOPIC_INCARNATION,
)
from setu.limits import MessageLimits
from setu.names import INGEST_SUFFIX, PRODUCER_MARKS_TOPIC
from setu.settings import Settings
from spark.dedup import partition_cap
from spark.rejects import routed_columns

# How long the broker may park a real-time task's fetch on a partition with nothing new (Kafka's
# default).
REALTIME_FETCH_WAIT_MS = 500

MARKS_TOPIC = PRODUCER_MARKS_TOPIC
"""The compacted changelog of producer marks (:data:`setu.names.PRODUCER_MARKS_TOPIC`)."""

# The columns the operator reads (spark/jvm/.../IngestDedup.java), besides those passed on.
TOPIC, PARTITION, OFFSET, KEY, VALUE, HEADERS = (
    "topic",
    "partition",
    "offset",
    "key",
    "value",
    "headers",
)
PRODUCER, SEQUENCE, INCARNATION, RECORD_MS = "producer", "seq", "incarnation", "record_ms"
MESSAGE_ID, WINDOW_MS, MARK = "message_id", "window_ms", "mark"


def _long(header: Column) -> Column:
    return header.cast("string").try_cast("bigint")


def key_column(header: Column) -> Column:
    """:func:`setu.envelope.kafka_key` as a column over a record's header map
    (tests/integration/spark/test_identity.py holds them equal); a record without Setu's
    headers keeps its own key."""
    return fn.coalesce(header[H_GROUP_ID], header[H_MESSAGE_ID], fn.col(KEY))


def ingest_position_headers() -> Column:
    """The headers that tell where a main log record came from: its ingest partition and
    offset (what delivery recognises a replay by, ``delivery/replays.py``)."""
    return fn.array(
        fn.struct(
            fn.lit(H_INGEST_PARTITION).alias("key"),
            fn.col(PARTITION).cast("string").cast("binary").alias("value"),
        ),
        fn.struct(
            fn.lit(H_INGEST_OFFSET).alias("key"),
            fn.col(OFFSET).cast("string").cast("binary").alias("value"),
        ),
    )


# What a shared-log record's ``setu-topic`` header must hold: a topic's main log.
MAIN_LOG_PATTERN = r"^setu\.[a-z0-9-]+\.[a-z0-9-]+$"


def from_shared_log(raw: DataFrame, shared_log: str | None) -> DataFrame:
    """``raw`` with each record of the shared ingest log ``shared_log`` (decision 0010) made to
    look like a record of its topic's own ingest topic: ``topic`` is the ingest topic its
    ``setu-topic`` header names, and that header gives way to ``setu-ingest-log``, which the
    main record keeps (delivery/replays.py). Every later step (the operator's key, the main
    log, the marks, the counts, retired topics) then reads as in the per-topic layout; a
    record of the shared log without a valid topic header (none the API wrote) is skipped.
    Records of other ingest topics pass as they are."""
    if shared_log is None:
        return raw
    headers = fn.col(HEADERS)
    named = fn.map_from_entries(headers)[H_TOPIC].cast("string")
    is_shared = fn.col(TOPIC) == fn.lit(shared_log)
    shared_headers = fn.concat(
        fn.filter(headers, lambda h: h["key"] != fn.lit(H_TOPIC)),
        fn.array(
            fn.struct(
                fn.lit(H_INGEST_LOG).alias("key"),
                fn.lit(shared_log).cast("binary").alias("value"),
            )
        ),
    )
    columns = {name: fn.col(name) for name in raw.columns}
    columns[TOPIC] = fn.when(is_shared, fn.concat(named, fn.lit(INGEST_SUFFIX))).otherwise(
        fn.col(TOPIC)
    )
    columns[HEADERS] = fn.when(is_shared, shared_headers).otherwise(headers)
    valid = ~is_shared | fn.coalesce(named.rlike(MAIN_LOG_PATTERN), fn.lit(False))
    return raw.where(valid).select(*(column.alias(name) for name, column in columns.items()))


def operator_rows(raw: DataFrame) -> DataFrame:
    """Kafka source rows as the operator reads them. The producer is null unless both producer
    id and a valid sequence are present; incarnation and window are 0 where a record carries
    none; ``mark`` is false (the operator's mark rows have it true)."""
    header = fn.map_from_entries(fn.col(HEADERS))
    sequence = _long(header[H_SEQUENCE_ID])
    return raw.select(
        fn.col(TOPIC),
        fn.col(PARTITION),
        fn.col(OFFSET),
        fn.col(VALUE),
        fn.col(HEADERS),
        key_column(header).alias(KEY),
        fn.when(sequence.isNotNull(), header[H_PRODUCER_ID].cast("string")).alias(PRODUCER),
        fn.coalesce(sequence, fn.lit(-1).cast("bigint")).alias(SEQUENCE),
        fn.coalesce(_long(header[H_TOPIC_INCARNATION]), fn.lit(0).cast("bigint")).alias(
            INCARNATION
        ),
        fn.unix_millis(fn.col("timestamp")).alias(RECORD_MS),
        header[H_MESSAGE_ID].cast("string").alias(MESSAGE_ID),
        fn.coalesce(_long(header[H_DEDUP_WINDOW]), fn.lit(0).cast("bigint")).alias(WINDOW_MS),
        fn.lit(False).alias(MARK),
    )


def deduplicated(
    spark: SparkSession,
    rows: DataFrame,
    ttl_ms: int,
    max_marks: int,
    max_ids: int,
    initial: DataFrame | None = None,
    counts: Any = None,
) -> DataFrame:
    """``rows`` (:func:`operator_rows`) through the JVM operator: each ingest partition's kept
    records in order, each record with a producer id followed by its mark row. ``initial``
    (topic, partition, marks) seeds partitions without state (decision 0008, "Migration");
    ``counts`` (:func:`topic_counts`) counts each topic's records kept and dropped."""
    operator = spark._jvm.setu.ingest.IngestDedup  # type: ignore[union-attr]
    seeds = initial._jdf if initial is not None else None
    return DataFrame(operator.apply(rows._jdf, seeds, ttl_ms, max_marks, max_ids, counts), spark)


def initial_state(spark: SparkSession, seeds: list[tuple[str, int, str]]) -> DataFrame | None:
    """The operator's initial state from (ingest topic, partition, encoded marks) rows
    (:func:`spark.migration.seed_marks`); None when there is nothing to seed.

    The rows are literals of one JVM partition. ``spark.createDataFrame`` of a Python list is a
    Python RDD of ``defaultParallelism`` partitions, each read by a Python worker: on a local
    master of 64 slots, 64 workers of about 57 MB held for a real-time batch, which took an
    upgraded ingest pod past its 3 GiB memory limit (tests/install/test_upgrade.py)."""
    if not seeds:
        return None
    rows = fn.array(
        *(
            fn.struct(
                fn.lit(topic).alias("topic"),
                fn.lit(partition).cast("int").alias("partition"),
                fn.lit(marks).alias("marks"),
            )
            for topic, partition, marks in seeds
        )
    )
    return spark.range(0, 1, 1, numPartitions=1).select(fn.inline(rows))


def topic_counts(spark: SparkSession) -> Any:
    """A new accumulator of the operator's decisions (``setu.ingest.TopicCounts``), registered
    on the driver; :func:`read_counts` reads it."""
    return spark._jvm.setu.ingest.TopicCounts.registered(spark._jsc.sc())  # type: ignore[union-attr]


def live_counts(spark: SparkSession, counts: Any) -> Any:
    """A driver listener (``setu.ingest.LiveCounts``) that reads ``counts`` while its tasks
    still run, from the executors' heartbeats; :func:`read_counts` reads it too."""
    return spark._jvm.setu.ingest.LiveCounts.listening(spark._jsc.sc(), counts)  # type: ignore[union-attr]


def read_counts(counts: Any) -> dict[str, tuple[int, int]]:
    """Ingest topic -> (records kept, dropped as duplicates) so far, of :func:`topic_counts`
    or :func:`live_counts`. One call to the JVM, as text: reading the map entry by entry cost
    two calls per topic, every second (half the idle driver's time at 200 topics)."""
    out: dict[str, tuple[int, int]] = {}
    for line in str(counts.encoded()).splitlines():
        topic, kept, dropped = line.split(" ")
        out[topic] = (int(kept), int(dropped))
    return out


def sink_columns() -> list[Column]:
    """Kept rows as Kafka sink rows (topic, key, value, headers): a record to its main log with
    its ingest partition and offset as headers, a mark row to :data:`MARKS_TOPIC`."""
    mark = fn.col(MARK)
    mark_key = fn.concat_ws("/", fn.col(TOPIC), fn.col(PARTITION).cast("string"), fn.col(PRODUCER))
    mark_value = fn.concat_ws(
        ":", fn.col(INCARNATION).cast("string"), fn.col(SEQUENCE).cast("string")
    )
    main = fn.regexp_replace(fn.col(TOPIC), re.escape(INGEST_SUFFIX) + "$", "")
    return [
        fn.when(mark, fn.lit(MARKS_TOPIC)).otherwise(main).alias("topic"),
        fn.when(mark, mark_key.cast("binary")).otherwise(fn.col(KEY).cast("binary")).alias("key"),
        fn.when(mark, mark_value.cast("binary")).otherwise(fn.col(VALUE)).alias("value"),
        fn.when(mark, fn.filter(fn.col(HEADERS), lambda h: fn.lit(False)))
        .otherwise(fn.concat(fn.col(HEADERS), ingest_position_headers()))
        .alias("headers"),
    ]


def sink_rows(kept: DataFrame, limits: Mapping[str, int], default_limit: int) -> DataFrame:
    """The operator's output as the Kafka sink writes it, a record its main topic cannot take
    routed to its reject topic (:func:`spark.rejects.routed_columns`)."""
    return kept.select(*sink_columns()).select(*routed_columns(limits, default_limit))


def without_retired(rows: DataFrame, retired: Collection[str]) -> DataFrame:
    """``rows`` but those of ``retired`` ingest topics (topics deleted through the API)."""
    return rows.where(~fn.col(TOPIC).isin(*sorted(retired))) if retired else rows


def start(
    spark: SparkSession,
    settings: Settings,
    pattern: str,
    *,
    realtime: bool,
    limits: Callable[[], Mapping[str, int]] = dict,
    retired: Callable[[], Collection[str]] = frozenset,
    initial: DataFrame | None = None,
    counts: Any = None,
    starting: str | None = None,
) -> StreamingQuery:
    """Starts the query over the ingest topics ``pattern`` matches, in real-time mode or in
    micro-batches; it resumes from the checkpoint if one exists. ``limits`` and ``retired`` are
    read once, here: a change to either takes a new start of the query. ``counts``
    (:func:`topic_counts`) counts each topic's records kept and dropped. ``starting`` (JSON,
    :func:`spark.migration.starting_offsets`) says where a new checkpoint starts reading,
    instead of every partition's first offset."""
    from spark.job import QUERY_NAME, sink_options, source_options

    options = source_options(settings, pattern)
    if starting is not None:
        options["startingOffsets"] = starting
    if realtime:
        # Real-time mode reads each partition as it comes; it refuses a per-batch bound.
        options.pop("maxOffsetsPerTrigger")
        # Its tasks poll all the time: a fetch the broker parks on a quiet partition returns as
        # soon as a record arrives, so a long park costs no latency, and a short one had every
        # idle partition's consumer ask the broker 100 times a second.
        options["kafka.fetch.max.wait.ms"] = str(REALTIME_FETCH_WAIT_MS)
    raw = spark.readStream.format("kafka").options(**options).load()
    shared = from_shared_log(raw, settings.shared_ingest_log())
    rows = without_retired(operator_rows(shared), retired())
    kept = deduplicated(
        spark,
        rows,
        settings.dedup_ttl_seconds * 1000,
        partition_cap(settings.dedup_max_producers),
        partition_cap(settings.dedup_max_message_ids),
        initial,
        counts,
    )
    default_limit = MessageLimits(settings.max_message_bytes).topic_bytes
    writer = (
        sink_rows(kept, limits(), default_limit)
        .writeStream.queryName(QUERY_NAME)
        .format("kafka")
        .options(**sink_options(settings))
        .option("checkpointLocation", settings.resolved_checkpoint_dir())
        .outputMode("update")
    )
    if realtime:
        batch = f"{settings.spark_realtime_batch_s} seconds"
        writer = writer.trigger(realTime=batch)  # type: ignore[call-overload]
    else:
        writer = writer.trigger(processingTime=f"{settings.spark_trigger_ms} milliseconds")
    return writer.start()
