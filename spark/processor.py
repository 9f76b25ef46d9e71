"""The stateful step of the ingest job: an ``applyInPandasWithState`` function.

Rows are grouped by *bucket* = hash(ingest topic, ingest partition) mod ``BUCKETS``: every
record of one ingest partition, with or without a producer id, goes through one bucket, and the
function emits a bucket's kept rows in (topic, partition, offset) order. Since a group lives on
one ingest partition, the rows of each group leave this step in ingest order, in one task, and
the Kafka sink can write them as they come: no second shuffle, no sort.

State per bucket: one value, the marks of every (topic, producer) seen in the bucket, each with
the topic incarnation it was built under (:func:`spark.dedup.encode_marks`). It travels to
Python with the bucket's rows and back with the output, in the same Arrow stream: one state read
and one write per bucket and batch, none per producer.

Bounds. A mark idle for ``dedup_ttl_seconds`` is dropped the next time its bucket is read, before
any decision, so it never judges a message again; the TTL is measured in batch time, so a
replayed batch sees the same marks. One bucket holds many producers, which lets the function
bound how many it tracks: each bucket keeps at most ``ceil(dedup_max_producers / BUCKETS)`` marks
and forgets the least recently seen beyond that (a producer writing to partitions in k buckets
counts k times). There is no state timeout: a timeout makes Spark visit the state every batch,
and a bucket nobody writes to any more holds at most its bounded share of marks.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd
from pyspark.accumulators import Accumulator
from pyspark.sql.streaming.state import GroupState, GroupStateTimeout

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
from spark.marks import ProducerHighs
from spark.metrics import TopicCounts

__all__ = [
    "BUCKET",
    "BUCKETS",
    "INCARNATION",
    "OFFSET",
    "PARTITION",
    "PRODUCER",
    "SEQUENCE",
    "TOPIC",
]

BUCKETS = 32
"""Fixed for the life of a checkpoint: changing it would move producers away from their marks."""
BUCKET = "bucket"

STATE_SCHEMA = "marks string"
TIMEOUT = GroupStateTimeout.NoTimeout


def bucket_cap(max_producers: int) -> int:
    """Marks one bucket may hold so that all buckets together hold at most ``max_producers``."""
    return max(1, -(-max_producers // BUCKETS))


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


class DedupFunction:
    """Keeps the rows of a bucket that are not duplicates; adds each producer's batch high to
    the ``highs`` accumulator. Picklable: Spark ships it to the Python workers."""

    def __init__(
        self,
        ttl_ms: int,
        max_producers: int,
        output_columns: list[str],
        highs: Accumulator[ProducerHighs],
        counts: Accumulator[TopicCounts],
    ) -> None:
        self.ttl_ms = ttl_ms
        self.cap = bucket_cap(max_producers)
        self.output_columns = output_columns
        # Both reach the driver with the task's result, i.e. only for rows the batch really
        # wrote.
        self.highs = highs
        self.counts = counts

    def __call__(
        self, key: tuple[Any, ...], frames: Iterator[pd.DataFrame], state: GroupState
    ) -> Iterator[pd.DataFrame]:
        frame = in_log_order(pd.concat(list(frames), ignore_index=True))
        if not state.exists and not frame[PRODUCER].notna().any():
            self.counts.add(topic_counts(frame[TOPIC]))
            yield frame[self.output_columns]
            return
        now_ms = int(state.getCurrentProcessingTimeMs())
        stored = decode_marks(state.get[0]) if state.exists else {}
        known = live_marks(stored, now_ms, self.ttl_ms)
        decision, highs = decide_incarnated(frame, known, now_ms)
        marks = {o: m for o, m in known.items() if o not in decision.dropped} | decision.marks
        for producer in least_recently_seen(marks, self.cap):
            del marks[producer]
        if marks:
            state.update((encode_marks(marks),))
        else:
            state.remove()
        if highs:
            self.highs.add(highs)
        self.counts.add(topic_counts(frame[TOPIC], decision.keep))
        yield frame.loc[decision.keep, self.output_columns]
