"""What a worker does for messages scheduled for later (docs/scheduling.md), beside the engine,
which decides: the engine holds a healthy group's scheduled message as its head by reference
(its offset in the main log, in the group's state) and, when it is due, asks for it again
(:meth:`delivery.engine.Effects.recall`). Here that record is read back from the main log
(unless the engine kept it), and the metadata database is asked whether its producer cancelled
it. The runner wakes its engines for their due heads every :data:`TICK_MS` while it works,
every second while it rests.
"""

from __future__ import annotations

import asyncio
import logging

from setu.ordering.records import Record
from setu.ordering.tiers import MAIN
from state.kafka_reader import KafkaReader, record_of
from state.schedule_cancels import ScheduleCancels

log = logging.getLogger(__name__)

TICK_MS = 200


class Recalls:
    """Reads held heads of one subscription back, and their producers' cancels."""

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

    async def record(self, partition: int, offset: int) -> Record | None:
        """The main log's record at ``offset``; None when retention has deleted it."""
        found, _, _ = await asyncio.to_thread(
            self._reader.read, self._main_topic, partition, offset, 1
        )
        if not found or found[0].offset() != offset:
            log.error(
                "%s/%s partition %d: the scheduled message at offset %d is gone from the main "
                "log (retention); it is not delivered",
                self._project,
                self._topic,
                partition,
                offset,
            )
            return None
        return record_of(MAIN, found[0])

    async def cancelled(self, message_id: str) -> bool:
        """Whether the producer cancelled ``message_id`` (never, without a database)."""
        if self._cancels is None:
            return False
        return await asyncio.to_thread(
            self._cancels.cancelled, self._project, self._topic, message_id
        )
