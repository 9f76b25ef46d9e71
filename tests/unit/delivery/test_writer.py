"""The batched state writer, on the stub store."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from delivery.engine import Transition
from delivery.writer import StateWriter
from setu.ordering.state import StateWrite
from state.groups_stub import StubGroupStore


class Owner:
    """A partition as the writer sees it; it is its own engine here."""

    def __init__(self) -> None:
        self.alive = True
        self.writing = 0
        self.applied: list[Transition] = []
        self.engine: Any = self

    def persisted(self, transition: Transition) -> None:
        self.applied.append(transition)


class RecordingStore(StubGroupStore):
    def __init__(self) -> None:
        super().__init__()
        self.batches: list[tuple[dict[int, list[tuple[int, int]]], list[StateWrite]]] = []
        self.gate = asyncio.Event()
        self.gate.set()

    async def apply_batch(
        self,
        delivered: Mapping[int, Sequence[tuple[int, int]]],
        writes: Sequence[StateWrite],
        epochs: Mapping[int, int] | None = None,
    ) -> None:
        await self.gate.wait()
        self.batches.append(({p: list(e) for p, e in delivered.items()}, list(writes)))
        await super().apply_batch(delivered, writes, epochs)


def owner() -> Owner:
    return Owner()


async def test_writes_gather_while_a_batch_is_in_flight() -> None:
    # Given a store that holds the first batch back
    store = RecordingStore()
    writer = StateWriter(store, lambda exc: None)
    a = owner()
    store.gate.clear()
    writer.write(a, Transition(StateWrite(0, "g1", outcomes=((0, 1),))))
    await asyncio.sleep(0)
    # When more writes and 2xx outcomes arrive meanwhile
    writer.delivered(0, 0, 5)
    writer.write(a, Transition(StateWrite(0, "g2", outcomes=((0, 2),))))
    writer.write(a, Transition(StateWrite(0, "g3", outcomes=((0, 3),))))
    assert a.writing == 3
    store.gate.set()
    await writer.flush()
    # Then they go out together in the second batch, outcomes with them, and each write is
    # reported to its owner once applied
    assert [len(w) for _, w in store.batches] == [1, 2]
    assert store.batches[1][0] == {0: [(0, 5)]}
    assert [t.write.group for t in a.applied] == ["g1", "g2", "g3"]
    assert a.writing == 0
    assert (await store.load(0)).outcomes == {(0, 1), (0, 2), (0, 3), (0, 5)}


async def test_outcomes_wait_for_a_ride_or_a_nudge() -> None:
    store = RecordingStore()
    writer = StateWriter(store, lambda exc: None)
    writer.delivered(1, 0, 9)
    await asyncio.sleep(0.01)
    assert store.batches == []
    writer.nudge()
    await writer.flush()
    assert store.batches[0][0] == {1: [(0, 9)]}


async def test_a_failed_batch_is_reported_and_its_writes_never_complete() -> None:
    class Broken(StubGroupStore):
        async def apply_batch(self, delivered: Any, writes: Any, epochs: Any = None) -> None:
            raise ConnectionError("redis went away")

    errors: list[BaseException] = []
    writer = StateWriter(Broken(), errors.append)
    a = owner()
    writer.write(a, Transition(StateWrite(0, "g1")))
    with pytest.raises(ConnectionError):
        await writer.flush()
    assert isinstance(errors[0], ConnectionError)
    assert (a.applied, a.writing) == ([], 0)


async def test_a_write_of_a_partition_given_up_is_applied_but_not_reported() -> None:
    store = RecordingStore()
    writer = StateWriter(store, lambda exc: None)
    a = owner()
    a.alive = False
    writer.write(a, Transition(StateWrite(0, "g1", outcomes=((0, 1),))))
    await writer.flush()
    assert a.applied == []
    assert (await store.load(0)).outcomes == {(0, 1)}


async def test_a_flush_asked_for_while_a_failing_batch_is_in_flight_fails_too() -> None:
    # Given a store that fails the batch it holds back
    class FailingStore(RecordingStore):
        async def apply_batch(
            self,
            delivered: Mapping[int, Sequence[tuple[int, int]]],
            writes: Sequence[StateWrite],
            epochs: Mapping[int, int] | None = None,
        ) -> None:
            await self.gate.wait()
            raise RuntimeError("Redis lost its writes")

    store = FailingStore()
    errors: list[BaseException] = []
    writer = StateWriter(store, errors.append)
    a = owner()
    store.gate.clear()
    writer.write(a, Transition(StateWrite(0, "g1")))
    await asyncio.sleep(0)
    # When a flush and another write are asked for while that batch is in flight
    writer.write(a, Transition(StateWrite(0, "g2")))
    flushing = asyncio.ensure_future(writer.flush())
    await asyncio.sleep(0)
    store.gate.set()
    # Then the flush fails with the batch instead of waiting forever, nothing is left
    # counted as being written, and the owner hears of the error
    with pytest.raises(RuntimeError, match="lost"):
        await asyncio.wait_for(flushing, 5)
    assert a.writing == 0
    assert len(errors) == 1


async def test_a_flush_given_up_on_while_its_batch_is_applied_fails_nothing() -> None:
    # Given a flush waiting for a batch the store holds back (a commit that a stopping runner
    # cancels)
    store = RecordingStore()
    errors: list[BaseException] = []
    writer = StateWriter(store, errors.append)
    a = owner()
    store.gate.clear()
    transition = Transition(StateWrite(0, "g1", outcomes=((0, 1),)))
    writer.write(a, transition)
    flush = asyncio.get_running_loop().create_task(writer.flush())
    await asyncio.sleep(0)
    # When the flush is cancelled, then the batch completes
    flush.cancel()
    await asyncio.sleep(0)
    store.gate.set()
    await asyncio.wait_for(writer.flush(), 5)
    # Then the write was applied and the writer reported no error
    assert a.applied == [transition]
    assert errors == []
