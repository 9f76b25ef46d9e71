"""The catch-up reader of the shared readers (delivery/readers.py): a cursor behind the live
reader takes every record from its own offset, even when the client refuses the turn's seek
and the reader goes on handing over records from where it was."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from delivery.cursors import PartitionCursors
from delivery.readers import ReaderHub
from tests.unit.delivery.main_log import MAIN, Record

KEY = (MAIN, 0)


class RefusingReader:
    """The catch-up consumer's thread, run at once: refuses its first ``refusals`` seeks as
    librdkafka does while a partition's fetcher is still starting."""

    def __init__(self, refusals: int) -> None:
        self.refusals = refusals
        self.seeks: list[int] = []

    def post(self, command: Callable[[Any], Any], then: Callable[[], None] | None = None) -> None:
        # As the consumer thread does: a refused command is logged, ``then`` runs all the same
        with contextlib.suppress(KafkaException, RuntimeError, ValueError):
            command(self)
        if then is not None:
            then()

    def resume(self, tps: list[TopicPartition]) -> None:
        pass

    def pause(self, tps: list[TopicPartition]) -> None:
        pass

    def seek(self, tp: TopicPartition) -> None:
        if self.refusals:
            self.refusals -= 1
            raise KafkaException(KafkaError(KafkaError._STATE))
        self.seeks.append(tp.offset)


class View:
    def __init__(self) -> None:
        self.taken: list[int] = []

    def deliver(self, messages: list[Any]) -> None:
        self.taken += [m.offset() for m in messages]


def test_records_read_while_a_turns_seek_is_refused_are_not_taken() -> None:
    async def scenario() -> None:
        # Given a main partition whose catch-up reader last read up to 20 for another
        # subscription, and subscription "a" behind it at 5
        hub = ReaderHub(lambda group: {}, lambda topic, partition: 0, "setu.delivery")
        reader = RefusingReader(refusals=2)
        hub.catch_up = reader  # type: ignore[assignment]
        view = View()
        hub._by_key["a"] = view  # type: ignore[assignment]
        cursors = hub._owned[KEY] = PartitionCursors()
        cursors.add("a", 5)
        cursors.live_next = 30
        hub._catching.add(KEY)  # assigned to the catch-up reader for an earlier turn
        # When a's turn seeks to 5 and the client refuses, twice, while the reader goes on
        # handing over what it reads from where it was
        hub._plan_catch_up(KEY)
        hub._on_catch_up([Record(20)])
        hub._on_catch_up([Record(20)])
        for _ in range(100):
            if reader.seeks:
                break
            await asyncio.sleep(0.02)
        # Then nothing from there was taken, the seek was asked again until it took, and
        # "a" reads on from its own offset
        assert view.taken == []
        assert reader.seeks == [5]
        hub._on_catch_up([Record(o) for o in range(5, 10)])
        assert view.taken == [5, 6, 7, 8, 9]

    asyncio.run(scenario())


class End(Record):
    """The partition's end, as the client hands it over (``enable.partition.eof``)."""

    def error(self) -> KafkaError:  # type: ignore[override]
        return KafkaError(KafkaError._PARTITION_EOF)


def test_an_end_read_for_a_turn_that_ended_does_not_move_the_next_turns_riders() -> None:
    async def scenario() -> None:
        # Given subscription "b" riding a catch-up turn from 60, and "a" waiting at 31
        hub = ReaderHub(lambda group: {}, lambda topic, partition: 0, "setu.delivery")
        reader = RefusingReader(refusals=0)
        hub.catch_up = reader  # type: ignore[assignment]
        views = {name: View() for name in ("a", "b")}
        hub._by_key.update(views)  # type: ignore[arg-type]
        cursors = hub._owned[KEY] = PartitionCursors()
        cursors.add("b", 60)
        cursors.add("a", 31)
        cursors.live_next = 70
        hub._catching.add(KEY)
        hub._plan_catch_up(KEY)
        assert reader.seeks == [60]
        # When b's turn ends at its first record (b has no room now), and the reader hands
        # over what it read on for that turn, up to the partition's end
        cursors.set_room("b", False)
        hub._on_catch_up([Record(60), Record(61), End(62)])
        # Then a is where it was: its own turn seeks to 31, and it takes every record from there
        assert cursors.next_offset("a") == 31
        assert not cursors.asking_first
        assert reader.seeks == [60, 31]
        hub._on_catch_up([Record(o) for o in range(31, 36)])
        assert views["a"].taken == [31, 32, 33, 34, 35]

    asyncio.run(scenario())
