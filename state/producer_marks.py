"""Producer marks in Redis: per (topic, producer), the hash field
``keys.producer_marks(project, topic)[producer]``, ``"<incarnation>:<sequence>"``. The ingest job
raises them after each batch (``spark/marks.py``); ``GET …/producers/{id}`` reads them.

The raise is a Lua script that compares (incarnation, sequence) pairs, so a replayed batch or a
late writer never moves a mark backwards, and a late batch of a deleted topic never overwrites
the mark of the topic created again under its name. A value without a colon was written before
incarnations (incarnation 0).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import redis
from redis.asyncio import Redis

from state import keys

NO_SEQUENCE = -1

Mark = tuple[int, int]
"""(topic incarnation, highest accepted sequence): compared as a pair, incarnation first."""

# KEYS[1] = marks hash; ARGV = producer, incarnation, sequence, producer, ...
# (also raises the stream points of state/stream_sessions.py, which share the format)
RAISE_MARKS = """
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


class MarkStore(Protocol):
    """What the ingest job does with marks: raise them; and read one back."""

    def raise_marks(self, project: str, topic: str, marks: Mapping[str, Mark]) -> None: ...

    def mark(self, project: str, topic: str, producer: str) -> Mark | None: ...

    def all_loaded(self) -> bool: ...

    def set_all_loaded(self) -> None: ...


class ProducerMarks:
    """Raises marks (the ingest job, synchronous). :class:`StubProducerMarks` keeps the same
    contract in memory (the same tests run on both)."""

    def __init__(self, client: redis.Redis[bytes]) -> None:
        self._client = client
        self._raise = client.register_script(RAISE_MARKS)

    def mark(self, project: str, topic: str, producer: str) -> Mark | None:
        """The producer's stored mark, whatever its incarnation."""
        raw = self._client.hget(keys.producer_marks(project, topic), producer)
        return None if raw is None else parse_mark(raw)

    def all_loaded(self) -> bool:
        """Whether Redis holds every mark: the marker the ingest job sets once it published
        them all (Redis that forgot its data lacks it; docs/ingest.md)."""
        return bool(self._client.exists(keys.producer_marks_loaded()))

    def set_all_loaded(self) -> None:
        self._client.set(keys.producer_marks_loaded(), "1")

    def raise_marks(self, project: str, topic: str, marks: Mapping[str, Mark]) -> None:
        """Raises each producer's mark of ``topic`` to the given one where it is higher."""
        args: list[str | int] = []
        for producer, (incarnation, sequence) in marks.items():
            args += [producer, incarnation, sequence]
        if args:
            self._raise(keys=[keys.producer_marks(project, topic)], args=args)


class MarksUnavailable(Exception):
    """Raised when Redis does not hold the producer marks in full (it forgot them, and the
    ingest job has not published them again yet): no point may be answered from it."""


async def marks_loaded(client: Redis[bytes]) -> bool:
    """Whether Redis holds every producer mark (:meth:`ProducerMarks.all_loaded`), for the
    API's health report; raises Redis errors (Redis away)."""
    return bool(await client.exists(keys.producer_marks_loaded()))


async def read_last_sequence(
    client: Redis[bytes], project: str, topic: str, producer: str, topic_incarnation: int
) -> int:
    """What ``GET …/producers/{id}`` answers (see :func:`last_sequence`); raises
    :class:`MarksUnavailable` while the marks are not loaded."""
    async with client.pipeline(transaction=False) as pipe:
        pipe.hget(keys.producer_marks(project, topic), producer)
        pipe.exists(keys.producer_marks_loaded())
        raw, loaded = await pipe.execute()
    if not loaded:
        raise MarksUnavailable(MARKS_UNAVAILABLE)
    return last_sequence(raw, topic_incarnation)


MARKS_UNAVAILABLE = (
    "producer marks are not loaded: Redis lost them and the ingest job has not published "
    "them again yet (it does at its next batch); try again shortly"
)


def parse_mark(raw: bytes | str) -> tuple[int, int]:
    """A stored mark as (topic incarnation, sequence). ``"<incarnation>:<sequence>"``; a bare
    sequence was written before incarnations existed (incarnation 0)."""
    text = raw.decode() if isinstance(raw, bytes) else raw
    incarnation, _, sequence = text.rpartition(":")
    return int(incarnation or 0), int(sequence)


def last_sequence(raw: bytes | str | None, topic_incarnation: int) -> int:
    """The highest sequence accepted from the producer in the topic's current incarnation
    (-1 if none): a mark a deleted topic of the same name left behind does not count."""
    if raw is None:
        return NO_SEQUENCE
    incarnation, sequence = parse_mark(raw)
    if incarnation not in (0, topic_incarnation):
        return NO_SEQUENCE
    return sequence


class StubProducerMarks:
    """:class:`ProducerMarks` in memory."""

    def __init__(self) -> None:
        self.marks: dict[tuple[str, str, str], Mark] = {}
        self.loaded = False

    def raise_marks(self, project: str, topic: str, marks: Mapping[str, Mark]) -> None:
        for producer, mark in marks.items():
            key = (project, topic, producer)
            if mark > self.marks.get(key, (-1, -1)):
                self.marks[key] = mark

    def mark(self, project: str, topic: str, producer: str) -> Mark | None:
        return self.marks.get((project, topic, producer))

    def all_loaded(self) -> bool:
        return self.loaded

    def set_all_loaded(self) -> None:
        self.loaded = True
