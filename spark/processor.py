"""The de-duplication step of the ingest job: a ``mapInPandas`` function run inside each batch.

The Kafka source gives every ingest partition's offset range of a batch to one task, in offset
order, and de-duplication is per ingest partition (spark/dedup.py): so each task decides its
own rows, with the marks of its own partition, and hands them on in ingest order to the Kafka
sink in the same task. No shuffle, no stateful operator: the marks are versioned by batch in
the checkpoint (:mod:`spark.dedup_state`), read once and written once per partition and batch,
and only for a partition whose batch holds a message with a producer id.

Time. Marks expire and are ranked by *record* time: the newest ingest timestamp of the
partition's rows in the batch (the API's produce time). It is the same whenever the batch runs
again, so a replayed batch sees the same marks.

Bounds. A mark idle for ``dedup_ttl_seconds`` is dropped the next time its partition is read,
before any decision, so it never judges a message again. Each partition keeps at most
``ceil(dedup_max_producers / SHARES)`` marks and forgets the least recently seen beyond that
(a producer writing to k partitions counts k times); a partition nobody writes to any more
keeps its bounded file.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import numpy.typing as npt
import pandas as pd
from pyspark.accumulators import Accumulator

from setu.tracing import MAX_LINKS
from spark.dedup import (
    INCARNATION,
    OFFSET,
    PARTITION,
    PRODUCER,
    SEQUENCE,
    TOPIC,
    decide_incarnated,
    decode_marks,
    encode_marks,
    least_recently_seen,
    live_marks,
)
from spark.dedup_state import PartitionMarks
from spark.marks import ProducerHighs
from spark.metrics import TopicCounts, WaitCounts, wait_counts

__all__ = [
    "INCARNATION",
    "OFFSET",
    "PARTITION",
    "PRODUCER",
    "SEQUENCE",
    "TOPIC",
]

SHARES = 32
"""Each partition keeps at most ``ceil(dedup_max_producers / SHARES)`` marks."""
RECORD_MS = "record_ms"
"""The ingest record's timestamp in ms (the API's produce time)."""
TRACEPARENT = "traceparent"
"""The record's W3C trace context, a column only when tracing (setu/tracing.py)."""


def partition_cap(max_producers: int) -> int:
    """Marks one ingest partition keeps."""
    return max(1, -(-max_producers // SHARES))


def in_log_order(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows sorted by (topic, partition, offset): the main log's order for every group."""
    topic, _ = pd.factorize(frame[TOPIC].to_numpy())
    order = np.lexsort((frame[OFFSET].to_numpy(), frame[PARTITION].to_numpy(), topic))
    return frame.take(order)


def topic_counts(topics: pd.Series, keep: npt.NDArray[np.bool_] | None = None) -> TopicCounts:
    """Per topic of ``topics``: (rows kept, rows dropped); ``keep`` None keeps every row."""
    total = topics.value_counts()
    dropped = topics[~keep].value_counts() if keep is not None else total.iloc[:0]
    return {
        str(topic): (int(n) - int(dropped.get(topic, 0)), int(dropped.get(topic, 0)))
        for topic, n in total.items()
    }


class PartitionDedup:
    """Keeps the rows of a task that are not duplicates, partition by partition; adds each
    producer's batch high to ``highs``, per topic the rows kept and dropped to ``counts``, and
    how long the rows waited for the batch to ``waits``. Picklable: Spark ships it to the
    Python workers, one per batch (it knows the batch's id)."""

    def __init__(
        self,
        batch: int,
        marks: PartitionMarks,
        ttl_ms: int,
        max_producers: int,
        output_columns: list[str],
        highs: Accumulator[ProducerHighs],
        counts: Accumulator[TopicCounts],
        waits: Accumulator[WaitCounts] | None = None,
        batch_started_ms: int = 0,
        traces: Accumulator[list[str]] | None = None,
    ) -> None:
        self.batch = batch
        self.marks = marks
        self.ttl_ms = ttl_ms
        self.cap = partition_cap(max_producers)
        self.output_columns = output_columns
        # These reach the driver with the task's result, i.e. only for rows the batch wrote.
        self.highs = highs
        self.counts = counts
        self.waits = waits
        self.batch_started_ms = batch_started_ms
        self.traces = traces

    def __call__(self, frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        chunks = [f for f in frames if len(f)]
        if not chunks:
            return
        frame = in_log_order(pd.concat(chunks, ignore_index=True))
        if self.waits is not None and self.batch_started_ms:
            waited = (self.batch_started_ms - frame[RECORD_MS].to_numpy(dtype=np.int64)) / 1000
            self.waits.add(wait_counts(waited))
        if self.traces is not None and TRACEPARENT in frame:
            self.traces.add(frame[TRACEPARENT].dropna().head(MAX_LINKS).tolist())
        # Normally one partition per task; several would each keep their own marks.
        for (topic, partition), rows in frame.groupby([TOPIC, PARTITION], sort=False):
            yield self._partition(str(topic), int(partition), rows)

    def _partition(self, topic: str, partition: int, frame: pd.DataFrame) -> pd.DataFrame:
        if not frame[PRODUCER].notna().any():
            self.counts.add(topic_counts(frame[TOPIC]))
            return frame[self.output_columns]
        now_ms = int(frame[RECORD_MS].max())
        loaded = self.marks.load(topic, partition, self.batch)
        stored = decode_marks(loaded.text) if loaded.text else {}
        known = live_marks(stored, now_ms, self.ttl_ms)
        decision, highs = decide_incarnated(frame, known, now_ms)
        marks = {o: m for o, m in known.items() if o not in decision.dropped} | decision.marks
        for producer in least_recently_seen(marks, self.cap):
            del marks[producer]
        self.marks.save(topic, partition, self.batch, encode_marks(marks))
        if highs:
            self.highs.add(highs)
        self.counts.add(topic_counts(frame[TOPIC], decision.keep))
        return frame.loc[decision.keep, self.output_columns]
