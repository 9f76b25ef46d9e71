"""Producer high marks in Redis: what ``GET .../producers/{producer_id}`` answers.

After a batch is in the main log the job raises, per (topic, producer), the hash field
``state.keys.producer_marks(project, topic)[producer]`` to ``"<incarnation>:<sequence>"``: the
highest sequence the batch accepted, under the topic incarnation it was accepted in
(:mod:`spark.dedup`). The raise is a Lua script that compares (incarnation, sequence) pairs, so
a replayed batch or a late writer never moves a mark backwards, and a late batch of a deleted
topic never overwrites the mark of the topic created again under its name (the API answers a
mark only for its topic's current incarnation). A value without a colon is a mark written
before incarnations (incarnation 0).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping

import redis
from pyspark.accumulators import AccumulatorParam

from setu.names import parse_ingest_topic
from state import keys

log = logging.getLogger(__name__)

# KEYS[1] = marks hash; ARGV = producer, incarnation, sequence, producer, ...
_RAISE = """
for i = 1, #ARGV, 3 do
  local current = redis.call('HGET', KEYS[1], ARGV[i])
  local incarnation, sequence = -1, -1
  if current then
    local colon = string.find(current, ':', 1, true)
    if colon then
      incarnation = tonumber(string.sub(current, 1, colon - 1))
      sequence = tonumber(string.sub(current, colon + 1))
    else
      incarnation, sequence = 0, tonumber(current)
    end
  end
  local new_incarnation, new_sequence = tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2])
  if new_incarnation > incarnation
      or (new_incarnation == incarnation and new_sequence > sequence) then
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1] .. ':' .. ARGV[i + 2])
  end
end
return 0
"""

Mark = tuple[int, int]
"""(topic incarnation, highest accepted sequence): compared as a pair, incarnation first."""

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
        self._raise = client.register_script(_RAISE)
        self._patience_s = patience_s
        self._sleep = sleep

    def publish(self, marks: Mapping[str, Mapping[str, Mark]]) -> None:
        """Raise every mark; raises redis errors once Redis stayed away for ``patience_s``
        (the batch then fails and is replayed)."""
        waited, pause = 0.0, 0.2
        while True:
            try:
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
            project, topic = parse_ingest_topic(ingest_topic)
            args: list[str | int] = []
            for producer, (incarnation, sequence) in producers.items():
                args += [producer, incarnation, sequence]
            if args:
                self._raise(keys=[keys.producer_marks(project, topic)], args=args)
