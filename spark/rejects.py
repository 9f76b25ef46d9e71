"""Records the ingest job can never write to their main log: set aside, not retried forever.

A batch that the Kafka sink cannot write fails and is replayed, forever if one of its records
can never be written. So before the write, each row is checked against what its main topic
takes, and a row that fails the check is routed, in the same write, to its topic's ingest
reject topic (``setu.{p}.{t}.ingest.rejects``) with the reason in the ``setu-reject-reason``
header, instead of to its main log. Every other row, and every other topic, goes on.

The checks:

- *Too large*: the record's size (an estimate never below the real one) is over its main
  topic's ``max.message.bytes`` or the sink's request limit. The limits Setu sets take every
  record the API accepts (:mod:`setu.limits`), so this happens only to a topic whose limit was
  lowered by hand. The job reads the main topics' limits from the broker every few seconds
  (:mod:`spark.topics`).
- *Corrupt headers*: a header without a name, which no Kafka client writes (only a record
  written to the ingest topic by something other than the API can carry one).

Order: a rejected row leaves its group's sequence in the main log; the rows after it keep their
order. The dedup step accepted the row, so ``GET .../producers/{id}`` counts it: a producer
does not send it again, and it is findable in the reject topic, never silently dropped.
"""

from __future__ import annotations

from collections.abc import Mapping

from pyspark.sql import Column
from pyspark.sql import functions as fn

from setu.envelope import H_REJECT_REASON
from setu.names import INGEST_REJECTS_SUFFIX

REASON_HEADER = H_REJECT_REASON
# A record batch's framing and a record's framing around key, value and headers (v2 format,
# varints at their longest): with them the estimate is never below a record's real size in a
# batch of its own (the sink does not compress).
BATCH_OVERHEAD_BYTES = 61
RECORD_OVERHEAD_BYTES = 32
HEADER_OVERHEAD_BYTES = 10


def size_column(key: Column, value: Column, headers: Column) -> Column:
    """An estimate, never below the real size, of a sink row's record in a batch of its own
    (key and value binary, headers key/value structs)."""
    header_bytes = fn.aggregate(
        headers,
        fn.lit(0).cast("long"),
        lambda acc, h: (
            acc
            + HEADER_OVERHEAD_BYTES
            + fn.coalesce(fn.octet_length(h["key"]), fn.lit(0))
            + fn.coalesce(fn.octet_length(h["value"]), fn.lit(0))
        ),
    )
    return (
        fn.lit(BATCH_OVERHEAD_BYTES + RECORD_OVERHEAD_BYTES)
        + fn.coalesce(fn.octet_length(key), fn.lit(0))
        + fn.coalesce(fn.octet_length(value), fn.lit(0))
        + header_bytes
    )


def routed_columns(limits: Mapping[str, int], default_limit: int) -> list[Column]:
    """Sink rows (topic, key, value, headers) with every row that its main topic cannot take
    sent to the topic's reject topic instead, its reason added as a header. ``limits`` holds
    the main topics' known ``max.message.bytes``; others, and every row, are held to at most
    ``default_limit`` (the sink's own request limit, less its framing).

    The columns hold no data frame, so one list serves every batch while the limits stay the
    same: building them costs tens of calls into the JVM (50-80 ms a batch, measured)."""
    topic, key, value, headers = fn.col("topic"), fn.col("key"), fn.col("value"), fn.col("headers")
    limit = fn.lit(default_limit)
    if limits:
        known = fn.create_map(*[fn.lit(x) for item in sorted(limits.items()) for x in item])
        limit = fn.least(fn.coalesce(known[topic], fn.lit(default_limit)), fn.lit(default_limit))
    size = size_column(key, value, headers)
    nameless = fn.exists(headers, lambda h: fn.coalesce(fn.length(h["key"]), fn.lit(0)) == 0)
    reason = (
        fn.when(nameless, fn.lit("corrupt headers: a header without a name"))
        .when(
            size > limit,
            fn.format_string(
                "record of %d bytes is over the %d bytes its main topic %s takes",
                size,
                limit,
                topic,
            ),
        )
        .otherwise(fn.lit(None))
    )
    reason_header = fn.struct(
        fn.lit(REASON_HEADER).alias("key"), reason.cast("binary").alias("value")
    )
    return [
        fn.when(reason.isNull(), topic)
        .otherwise(fn.concat(topic, fn.lit(INGEST_REJECTS_SUFFIX)))
        .alias("topic"),
        key.alias("key"),
        value.alias("value"),
        fn.when(reason.isNull(), headers)
        .otherwise(
            fn.concat(
                fn.filter(headers, lambda h: fn.coalesce(fn.length(h["key"]), fn.lit(0)) > 0),
                fn.array(reason_header),
            )
        )
        .alias("headers"),
    ]
