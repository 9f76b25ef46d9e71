"""The de-duplication step of the ingest job: a ``mapInPandas`` function run inside each batch.

The Kafka source gives every ingest partition's offset range of a batch to one task, in offset
order, and de-duplication is per ingest partition (spark/dedup.py): so each task decides its
own rows, with the marks of its own partition, and hands them on in ingest order to the Kafka
sink in the same task. No shuffle, no stateful operator: the marks are versioned by batch in
the checkpoint (:mod:`spark.dedup_state`), read once and written once per partition and batch,
and only for a partition whose batch holds a message with a producer id.

Memory. The rows are decided one Arrow chunk at a time and each chunk's kept rows are handed
on before the next chunk is read (:mod:`spark.dedup_stream`): a task never holds its batch,
only a chunk, which Spark bounds in bytes (``spark.sql.execution.arrow.maxBytesPerBatch``,
spark/job.py).

Time. Marks expire and are ranked by *record* time: the newest ingest timestamp of the
partition's rows in the batch (the API's produce time). It is the same whenever the batch runs
again, so a replayed batch sees the same marks.

Bounds. A mark stops judging at the first row of its partition whose record time (the newest
so far) is ``dedup_ttl_seconds`` past the mark's last sight, and is dropped when the marks are
stored, so it never judges a message again. Each partition keeps at most
``ceil(dedup_max_producers / SHARES)`` marks and forgets the least recently seen beyond that
(a producer writing to k partitions counts k times); a partition nobody writes to any more
keeps its bounded file.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial

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
    ProducerKey,
    ProducerMark,
    decode_marks,
    encode_marks,
)
from spark.dedup_state import PartitionMarks
from spark.dedup_stream import PartitionStream
from spark.marks import ProducerHighs
from spark.metrics import TopicCounts, WaitCounts, add_counts, add_waits, wait_counts

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


def topic_counts(topics: pd.Series, keep: npt.NDArray[np.bool_] | None = None) -> TopicCounts:
    """Per topic of ``topics``: (rows kept, rows dropped); ``keep`` None keeps every row."""
    total = topics.value_counts()
    dropped = topics[~keep].value_counts() if keep is not None else total.iloc[:0]
    return {
        str(topic): (int(n) - int(dropped.get(topic, 0)), int(dropped.get(topic, 0)))
        for topic, n in total.items()
    }


class PartitionDedup:
    """Keeps the rows of a task that are not duplicates, chunk by chunk as Spark hands them
    over, partition by partition; adds each producer's batch high to ``highs``, per topic the
    rows kept and dropped to ``counts``, and how long the rows waited for the batch to
    ``waits``. Picklable: Spark ships it to the Python workers, one per batch (it knows the
    batch's id).

    Memory: one chunk at a time (Spark bounds a chunk in rows and in bytes, spark/job.py), plus
    per partition of the task its marks and its producers' batch highs. Each partition's rows
    must arrive in offset order across chunks, as the Kafka source gives them; a partition's
    marks are read at its first message with a producer id and stored once, after the last
    chunk (:class:`spark.dedup_stream.PartitionStream` has the rule across chunks)."""

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
        task = TaskProgress()
        for chunk in frames:
            if len(chunk):
                kept = self._chunk(task, chunk)
                if len(kept):
                    yield kept
        for stream in task.partitions.values():
            if stream.loaded:
                encoded = encode_marks(stream.marks(self.cap))
                self.marks.save(stream.topic, stream.partition, self.batch, encoded)
                highs = stream.highs()
                if highs:
                    self.highs.add(highs)
        if task.counts:
            self.counts.add(task.counts)
        if self.waits is not None and task.waited is not None:
            self.waits.add(task.waited)
        if self.traces is not None and task.traces:
            self.traces.add([trace for _, trace in sorted(task.traces)[:MAX_LINKS]])

    def _chunk(self, task: TaskProgress, chunk: pd.DataFrame) -> pd.DataFrame:
        frame = task.in_log_order(chunk)
        record_ms = frame[RECORD_MS].to_numpy(dtype=np.int64)
        if self.waits is not None and self.batch_started_ms:
            task.add_waits(wait_counts((self.batch_started_ms - record_ms) / 1000))
        if self.traces is not None and TRACEPARENT in frame:
            task.add_traces(frame)
        keep = np.ones(len(frame), dtype=np.bool_)
        # Normally one partition per task; several each keep their own marks.
        for (topic, partition), at in frame.groupby([TOPIC, PARTITION], sort=False).indices.items():
            key = (str(topic), int(partition))
            stream = task.partitions.get(key)
            if stream is None:
                stream = task.partitions[key] = PartitionStream(
                    *key, self.ttl_ms, partial(self._stored, *key)
                )
            task.check_order(key, frame[OFFSET].to_numpy()[at])
            keep[at] = stream.decide(frame.iloc[at], record_ms[at])
        add_counts(task.counts, topic_counts(frame[TOPIC], keep))
        return frame.loc[keep, self.output_columns]

    def _stored(self, topic: str, partition: int) -> dict[ProducerKey, ProducerMark]:
        loaded = self.marks.load(topic, partition, self.batch)
        return decode_marks(loaded.text) if loaded.text else {}


@dataclass
class TaskProgress:
    """What a task keeps between chunks: per partition its decision so far, and the batch's
    counts, waits and first traceparents so far."""

    partitions: dict[tuple[str, int], PartitionStream] = field(default_factory=dict)
    counts: TopicCounts = field(default_factory=dict)
    waited: WaitCounts | None = None
    traces: list[tuple[tuple[int, int, int], str]] = field(default_factory=list)
    """(position in log order, traceparent): the first ``MAX_LINKS`` so far."""
    topics: dict[str, int] = field(default_factory=dict)
    """Topic -> rank, in the order the task first saw them (its log order's first key)."""
    offsets: dict[tuple[str, int], int] = field(default_factory=dict)

    def in_log_order(self, chunk: pd.DataFrame) -> pd.DataFrame:
        """The chunk's rows by (topic, partition, offset), topics in the order the task met
        them: the main log's order for every group."""
        for topic in pd.unique(chunk[TOPIC].to_numpy()):
            self.topics.setdefault(str(topic), len(self.topics))
        rank = chunk[TOPIC].map(self.topics).to_numpy(dtype=np.int64)
        order = np.lexsort((chunk[OFFSET].to_numpy(), chunk[PARTITION].to_numpy(), rank))
        return chunk.take(order)

    def check_order(self, key: tuple[str, int], offsets: npt.NDArray[np.int64]) -> None:
        """Each partition's rows must come in offset order across chunks: its decisions carry
        over from one chunk to the next."""
        last = self.offsets.get(key)
        if last is not None and int(offsets[0]) <= last:
            raise RuntimeError(
                f"rows of {key[0]} partition {key[1]} arrived out of offset order "
                f"({int(offsets[0])} after {last})"
            )
        self.offsets[key] = int(offsets[-1])

    def add_waits(self, waits: WaitCounts) -> None:
        self.waited = waits if self.waited is None else add_waits(self.waited, waits)

    def add_traces(self, frame: pd.DataFrame) -> None:
        traced = frame[frame[TRACEPARENT].notna()].head(MAX_LINKS)
        positions = zip(
            traced[TOPIC].map(self.topics).tolist(),
            traced[PARTITION].tolist(),
            traced[OFFSET].tolist(),
            strict=True,
        )
        found = [
            ((int(t), int(p), int(o)), str(trace))
            for (t, p, o), trace in zip(positions, traced[TRACEPARENT].tolist(), strict=True)
        ]
        self.traces = sorted(self.traces + found)[:MAX_LINKS]
