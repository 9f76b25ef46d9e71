"""Producer marks from the ingest job: :class:`MarkPublisher` raises the producers' highest
accepted sequences in Redis as :mod:`spark.marks_changelog` reads them from the changelog the
query writes (:mod:`state.producer_marks` holds the stored form and the max-guarded raise)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping

import redis

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
