"""What a worker does for messages scheduled for later (docs/scheduling.md), beside the engine,
which decides: the engine holds a healthy group's scheduled message as its head by reference
(its offset in the main log, in the group's state) and, when it is due, asks for it again
(:meth:`delivery.engine.Effects.recall`). Here that record is read back from the main log
(unless the engine kept it), and the metadata database is asked whether its producer cancelled
it. The runner wakes its engines at the next head's time by a timer (set at each look and at
each takeover), and looks every :data:`TICK_MS` besides (every 5 s while it rests).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

from setu.ordering.records import Record
from setu.ordering.tiers import MAIN
from state.kafka_reader import KafkaReader, record_of
from state.schedule_cancels import ScheduleCancels

log = logging.getLogger(__name__)

TICK_MS = 200
K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class Recalls:
    """Reads held heads of one subscription back, and their producers' cancels. Asks that come
    while a read is under way wait for the next one, which takes them all: a thousand messages
    due at one moment are a few fetches of their partition and one database query, not a
    thousand of each (``bench/scheduling.py``)."""

    def __init__(
        self,
        reader: KafkaReader,
        main_topic: str,
        cancels: ScheduleCancels | None,
        project: str,
        topic: str,
    ) -> None:
        self._reader = reader
        self._main_topic = main_topic
        self._cancels = cancels
        self._project = project
        self._topic = topic
        self._records: dict[int, Batches[int, Record | None]] = {}
        self._cancelled = Batches[str, bool](self._look_up)

    async def record(self, partition: int, offset: int) -> Record | None:
        """The main log's record at ``offset``; None when retention has deleted it."""
        batches = self._records.get(partition)
        if batches is None:
            batches = self._records[partition] = Batches(
                lambda offsets: self._read(partition, offsets)
            )
        return await batches.ask(offset)

    async def cancelled(self, message_id: str) -> bool:
        """Whether the producer cancelled ``message_id`` (never, without a database)."""
        if self._cancels is None:
            return False
        return await self._cancelled.ask(message_id)

    def _read(self, partition: int, offsets: list[int]) -> dict[int, Record | None]:
        found = self._reader.read_offsets(self._main_topic, partition, offsets)
        out: dict[int, Record | None] = {}
        for offset in offsets:
            msg = found.get(offset)
            if msg is None:
                log.error(
                    "%s/%s partition %d: the scheduled message at offset %d is gone from the "
                    "main log (retention); it is not delivered",
                    self._project,
                    self._topic,
                    partition,
                    offset,
                )
            out[offset] = None if msg is None else record_of(MAIN, msg)
        return out

    def _look_up(self, message_ids: list[str]) -> dict[str, bool]:
        assert self._cancels is not None
        found = self._cancels.cancelled(self._project, self._topic, message_ids)
        return {m: m in found for m in message_ids}


class Batches(Generic[K, V]):
    """Answers asks in batches: ``answer`` (blocking, run in a thread) takes every key asked
    while the previous batch was under way. A failed batch fails each of its asks."""

    def __init__(self, answer: Callable[[list[K]], dict[K, V]]) -> None:
        self._answer = answer
        self._waiting: dict[K, list[asyncio.Future[V]]] = {}
        self._task: asyncio.Task[None] | None = None

    async def ask(self, key: K) -> V:
        loop = asyncio.get_running_loop()
        answered: asyncio.Future[V] = loop.create_future()
        self._waiting.setdefault(key, []).append(answered)
        if self._task is None:
            self._task = loop.create_task(self._drain())
        return await answered

    async def _drain(self) -> None:
        try:
            while self._waiting:
                batch, self._waiting = self._waiting, {}
                try:
                    found = await asyncio.to_thread(self._answer, list(batch))
                except Exception as exc:
                    for waiting in batch.values():
                        for future in waiting:
                            if not future.done():
                                future.set_exception(exc)
                    continue
                for key, waiting in batch.items():
                    for future in waiting:
                        if not future.done():
                            future.set_result(found[key])
        finally:
            self._task = None
