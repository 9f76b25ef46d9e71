"""Redis writes of one subscription's delivery, batched: recorded 2xx outcomes and group state
changes go out together in one script call (:meth:`state.groups.GroupStore.apply_batch`).

While one batch is in flight the next one gathers, so under load a single round trip carries
hundreds of changes, and at low load a change waits for nothing. Outcomes in a batch are
applied before its state changes, which keeps the rule that a failed group's state is never
durable while an earlier 2xx of it is not.

State changes always go out at once; 2xx outcomes wait for the next state change, an explicit
:meth:`StateWriter.flush` (every commit) or :meth:`StateWriter.nudge` (every 50 ms).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

from delivery.engine import PartitionEngine, Transition
from state.groups import GroupStore


class Owner(Protocol):
    """The partition a write belongs to: its engine, and whether it is still ours."""

    engine: PartitionEngine
    alive: bool
    writing: int


class StateWriter:
    """See the module doc. ``on_error`` is told when a batch fails; its writes never apply."""

    def __init__(self, store: GroupStore, on_error: Callable[[BaseException], None]) -> None:
        self._store = store
        self._on_error = on_error
        self._delivered: dict[int, list[tuple[int, int]]] = {}
        self._writes: list[tuple[Owner, Transition]] = []
        self._waiters: list[asyncio.Future[None]] = []
        self._task: asyncio.Task[None] | None = None

    def delivered(self, partition: int, tier: int, offset: int) -> None:
        entries = self._delivered.get(partition)
        if entries is None:
            entries = self._delivered[partition] = []
        entries.append((tier, offset))

    def write(self, owner: Owner, transition: Transition) -> None:
        owner.writing += 1
        self._writes.append((owner, transition))
        self._start()

    def nudge(self) -> None:
        """Sends 2xx outcomes waiting for a ride."""
        if self._delivered:
            self._start()

    async def flush(self) -> None:
        """Returns when everything handed in before the call is applied (raises if not)."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        self._start()
        await waiter

    def _start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        try:
            while self._writes or self._delivered or self._waiters:
                writes, self._writes = self._writes, []
                delivered, self._delivered = self._delivered, {}
                waiters, self._waiters = self._waiters, []
                try:
                    await self._store.apply_batch(delivered, [t.write for _, t in writes])
                except Exception as exc:
                    for owner, _ in writes:
                        owner.writing -= 1
                    for waiter in waiters:
                        waiter.set_exception(exc)
                    self._on_error(exc)
                    return
                for owner, transition in writes:
                    owner.writing -= 1
                    if owner.alive:
                        owner.engine.persisted(transition)
                for waiter in waiters:
                    waiter.set_result(None)
        except Exception as exc:  # a bug in an engine: give up on this runner
            self._on_error(exc)
        finally:
            self._task = None
