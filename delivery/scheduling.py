"""What a worker does for messages scheduled for later (docs/scheduling.md), beside the engine,
which decides: the engine holds a healthy group's scheduled message as its head by reference
(its offset in the main log, in the group's state) and, when it is due, asks for it again
(:meth:`delivery.engine.Effects.recall`). Here that record is read back from the main log
(unless the engine kept it), and the metadata database is asked whether its producer cancelled
it. The runner wakes its engines at the next head's time by a timer (set at each look and at
each takeover), and looks every :data:`TICK_MS` besides (every 5 s while it rests).
"""

from __future__ import annotations

import logging

from setu.batching import Batched, in_thread
from setu.ordering.records import Record
from setu.ordering.tiers import MAIN
from state.kafka_reader import KafkaReader, record_of
from state.schedule_cancels import ScheduleCancels

log = logging.getLogger(__name__)

TICK_MS = 200


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
        self._records: dict[int, Batched[int, Record | None]] = {}
        self._cancelled: Batched[str, bool] = Batched(in_thread(self._look_up))

    async def record(self, partition: int, offset: int) -> Record | None:
        """The main log's record at ``offset``; None when retention has deleted it."""
        batches = self._records.get(partition)
        if batches is None:
            batches = self._records[partition] = Batched(
                in_thread(lambda offsets: self._read(partition, offsets))
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
