"""Producer marks from the ingest job: each batch gathers its producers' highest accepted
sequences (an accumulator), and :class:`MarkPublisher` raises them in Redis once the batch is in
the main log (:mod:`state.producer_marks` holds the stored form and the max-guarded raise)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping

import redis
from pyspark.accumulators import AccumulatorParam

from setu.names import parse_ingest_topic
from state.producer_marks import Mark, ProducerMarks

log = logging.getLogger(__name__)

TopicMarks = dict[str, dict[str, Mark]]
"""Ingest topic -> producer id -> its mark."""


def by_topic(highs: Iterable[tuple[tuple[str, str], Mark]]) -> TopicMarks:
    """Group ((ingest topic, producer), mark) pairs by topic, keeping each producer's max."""
    out: TopicMarks = {}
    for (topic, producer), mark in highs:
        per_topic = out.setdefault(topic, {})
        if mark > per_topic.get(producer, (-1, -1)):
            per_topic[producer] = mark
    return out


ProducerHighs = dict[tuple[str, str], Mark]
"""(ingest topic, producer) -> its mark, as gathered in one batch."""


def merge_highs(into: ProducerHighs, other: Mapping[tuple[str, str], Mark]) -> ProducerHighs:
    """Raise ``into`` to ``other``, in place. Order and repetition do not matter (max)."""
    for producer, mark in other.items():
        if mark > into.get(producer, (-1, -1)):
            into[producer] = mark
    return into


class HighsParam(AccumulatorParam[ProducerHighs]):
    """A Spark accumulator of :data:`ProducerHighs`; a retried task adding twice is harmless."""

    def zero(self, value: ProducerHighs) -> ProducerHighs:
        return {}

    def addInPlace(  # noqa: N802 (Spark's name)
        self, value1: ProducerHighs, value2: ProducerHighs
    ) -> ProducerHighs:
        return merge_highs(value1, value2)


class MarkPublisher:
    """Raises producer marks in Redis; one instance per job.

    Redis being restarted (refused connections, "loading the dataset") is waited out, up to
    ``patience_s``: the batch is written already, and failing it would stop the job for every
    topic only to replay the same batch. Raising a mark is idempotent, so a retry after a
    partial publish is safe."""

    def __init__(
        self,
        client: redis.Redis[bytes],
        patience_s: float = 300.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._client = client
        self._marks = ProducerMarks(client)
        self._patience_s = patience_s
        self._sleep = sleep

    def publish(
        self,
        marks: Mapping[str, Mapping[str, Mark]],
        everything: Callable[[], Mapping[str, Mapping[str, Mark]]] | None = None,
    ) -> None:
        """Raise every mark; raises redis errors once Redis stayed away for ``patience_s``
        (the batch then fails and is replayed). When Redis lacks the marker that it holds
        every mark (it forgot them, or this is the first batch), ``everything`` the job knows
        is published first and the marker set (``keys.producer_marks_loaded``)."""
        waited, pause = 0.0, 0.2
        while True:
            try:
                if everything is not None and not self._marks.all_loaded():
                    every = everything()
                    self._publish(every)
                    self._marks.set_all_loaded()
                    log.warning(
                        "published the marks of %d producers again (Redis had none)",
                        sum(len(m) for m in every.values()),
                    )
                self._publish(marks)
                return
            except (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError) as exc:
                if waited >= self._patience_s:
                    raise
                log.warning(
                    "Redis is away (%s); publishing producer marks again in %.1f s", exc, pause
                )
                self._sleep(pause)
                waited += pause
                pause = min(pause * 2, 5.0)

    def _publish(self, marks: Mapping[str, Mapping[str, Mark]]) -> None:
        for ingest_topic, producers in marks.items():
            self._marks.raise_marks(*parse_ingest_topic(ingest_topic), producers)


class MarksKeeper:
    """Publishes every producer mark again, on a thread of its own, as soon as Redis lost them.

    The batch writer does it too, but only when a batch runs, and a batch runs only when
    messages arrive. A producer that restarts asks ``GET .../producers/{id}`` where to resume
    and gets 503 until the marks are back: if it is the only one sending, no message arrives,
    no batch runs, and it waits for ever. So this looks every ``interval_s`` and, when Redis
    lacks the marker of holding every mark, publishes ``everything`` (what the committed
    batches left: :func:`spark.job.committed_marks`) and sets it."""

    def __init__(
        self,
        publisher: MarkPublisher,
        everything: Callable[[], Mapping[str, Mapping[str, Mark]]],
        interval_s: float = 1.0,
    ) -> None:
        self._publisher = publisher
        self._everything = everything
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="marks-keeper", daemon=True)

    def start(self) -> MarksKeeper:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                self._publisher.publish({}, self._everything)
            except Exception:
                # Redis away past the publisher's patience, or the checkpoint unreadable for a
                # moment: the next look tries again.
                log.exception("could not publish the producer marks again")
