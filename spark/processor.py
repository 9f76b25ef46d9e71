"""The stateful step of the ingest job: a ``transformWithStateInPandas`` processor.

Rows are grouped by *bucket* = hash(ingest topic, ingest partition) mod ``BUCKETS``: every
record of one ingest partition, with or without a producer id, goes through one bucket, and the
processor emits a bucket's kept rows in (topic, partition, offset) order. Since a group lives on
one ingest partition, the rows of each group leave this step in ingest order, in one task, and
the Kafka sink can write them as they come: no second shuffle, no sort.

One bucket holds many producers, which lets the processor bound how many it tracks: each bucket
keeps at most ``ceil(dedup_max_producers / BUCKETS)`` marks and forgets the least recently seen
beyond that (a producer writing to partitions in k buckets counts k times). Idle marks also
expire on their own through the map state's TTL (``dedup_ttl_seconds``), measured in batch
time, so a replayed batch sees the same marks.

State per bucket (RocksDB state store, checkpointed with the query):
  ``marks``   map (topic, producer) -> (last_seen_ms, partition marks), with TTL
  ``tracked`` how many marks the bucket holds at most (expired marks make it an over-count,
              which only triggers an exact recount sooner)
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pandas as pd
from pyspark.accumulators import Accumulator
from pyspark.sql.streaming.stateful_processor import (
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
)

from spark.dedup import (
    Incoming,
    ProducerMark,
    decide_batch,
    decode_partitions,
    encode_partitions,
    least_recently_seen,
)
from spark.marks import ProducerHighs

BUCKETS = 32
"""Fixed for the life of a checkpoint: changing it would move producers away from their marks."""

MARK_KEY_SCHEMA = "topic string, producer string"
ProducerKey = tuple[str, str]
MARK_VALUE_SCHEMA = "last_seen_ms bigint, partitions string"
TRACKED_SCHEMA = "n bigint"

# Columns the processor reads besides the payload it passes through.
TOPIC, PARTITION, OFFSET = "topic", "partition", "offset"
PRODUCER, SEQUENCE, BUCKET = "producer", "seq", "bucket"


def bucket_cap(max_producers: int) -> int:
    """Marks one bucket may hold so that all buckets together hold at most ``max_producers``."""
    return max(1, -(-max_producers // BUCKETS))


def mark_to_state(mark: ProducerMark) -> tuple[int, str]:
    return (mark.last_seen_ms, encode_partitions(mark.partitions))


def mark_from_state(value: tuple[Any, ...]) -> ProducerMark:
    last_seen_ms, partitions = value
    return ProducerMark(decode_partitions(partitions), int(last_seen_ms))


class DedupProcessor(StatefulProcessor):
    """Keeps the rows of a bucket that are not duplicates; adds each producer's batch high to
    the ``highs`` accumulator."""

    def __init__(
        self,
        ttl_ms: int,
        max_producers: int,
        output_columns: list[str],
        highs: Accumulator[ProducerHighs],
    ) -> None:
        self.ttl_ms = ttl_ms
        self.cap = bucket_cap(max_producers)
        self.output_columns = output_columns
        # Reaches the driver with the task's result, i.e. only for rows the batch really wrote.
        self.highs = highs

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.marks = handle.getMapState("marks", MARK_KEY_SCHEMA, MARK_VALUE_SCHEMA, self.ttl_ms)
        self.tracked = handle.getValueState("tracked", TRACKED_SCHEMA)

    def handleInputRows(  # noqa: N802 (Spark's name)
        self,
        key: tuple[Any, ...],
        rows: Iterator[pd.DataFrame],
        timerValues: TimerValues,  # noqa: N803
    ) -> Iterator[pd.DataFrame]:
        frame = pd.concat(list(rows), ignore_index=True)
        # The output order is the main log's order for every group of this bucket.
        frame = frame.sort_values([TOPIC, PARTITION, OFFSET], ignore_index=True)
        if not frame[PRODUCER].notna().any():
            yield frame[self.output_columns]
            return
        now_ms = int(timerValues.getCurrentProcessingTimeInMs())
        producers: list[ProducerKey | None] = [
            None if producer is None else (topic, producer)
            for topic, producer in zip(frame[TOPIC].tolist(), frame[PRODUCER].tolist(), strict=True)
        ]
        # Rows without a producer carry no sequence; any number serves, they are always kept.
        columns = [frame[PARTITION], frame[OFFSET], frame[SEQUENCE].fillna(-1)]
        ints = (c.astype("int64").tolist() for c in columns)
        messages = list(map(Incoming, *ints))
        known = self._load({p for p in producers if p is not None})
        decision = decide_batch(producers, messages, known, now_ms)
        for producer, mark in decision.marks.items():
            self.marks.updateValue(producer, mark_to_state(mark))
        self._bound(added=sum(1 for p in decision.marks if p not in known))
        self.highs.add(decision.highs)
        yield frame.loc[decision.accepted, self.output_columns]

    def _load(self, producers: set[ProducerKey]) -> dict[ProducerKey, ProducerMark]:
        known: dict[ProducerKey, ProducerMark] = {}
        for producer in producers:
            value = self.marks.getValue(producer)
            if value is not None:
                known[producer] = mark_from_state(value)
        return known

    def _bound(self, added: int) -> None:
        """Keep the bucket at most ``cap`` marks, forgetting the least recently seen."""
        stored = self.tracked.get()
        tracked = (int(stored[0]) if stored is not None else 0) + added
        if tracked > self.cap:
            current = {tuple(k): mark_from_state(v) for k, v in self.marks.iterator()}
            forget = least_recently_seen(current, self.cap)
            for producer in forget:
                self.marks.removeKey(producer)
            tracked = len(current) - len(forget)
        self.tracked.update((tracked,))

    def close(self) -> None:
        pass
