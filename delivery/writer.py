"""Redis writes of one subscription's delivery, batched: recorded 2xx outcomes and group state
changes go out together in one script call (:meth:`state.groups.GroupStore.apply_batch`).

While one batch is in flight the next one gathers, so under load a single round trip carries
hundreds of changes, and at low load a change waits for nothing. Outcomes in a batch are
applied before its state changes, which keeps the rule that a failed group's state is never
durable while an earlier 2xx of it is not.

State changes always go out at once; 2xx outcomes wait for the next state change, an explicit
:meth:`StateWriter.flush` (every commit) or :meth:`StateWriter.nudge` (every 50 ms).

Fencing: given ``epoch_of``, every batch names the owner epoch of each partition it touches
and the store refuses it if one moved on (:class:`state.groups.Fenced`); what is meant for a
partition this worker no longer owns (``epoch_of`` gives None) is dropped, never sent.
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

    def __init__(
        self,
        store: GroupStore,
        on_error: Callable[[BaseException], None],
        epoch_of: Callable[[int], int | None] | None = None,
    ) -> None:
        self._store = store
        self._on_error = on_error
        self._epoch_of = epoch_of
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

    @property
    def waiting(self) -> bool:
        """2xx outcomes wait for a ride (:meth:`nudge`)."""
        return bool(self._delivered)

    @property
    def idle(self) -> bool:
        """Nothing handed in and not applied yet: a flush would return at once."""
        return self._task is None and not (self._writes or self._delivered or self._waiters)

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
                epochs = self._fence(writes, delivered)
                try:
                    await self._store.apply_batch(delivered, [t.write for _, t in writes], epochs)
                except Exception as exc:
                    # What gathered meanwhile fails with it: its waiters would otherwise wait
                    # for a batch that never starts (the owner gives up on this error).
                    writes += self._writes
                    waiters += self._waiters
                    self._writes, self._waiters, self._delivered = [], [], {}
                    for owner, _ in writes:
                        owner.writing -= 1
                    for waiter in waiters:
                        if not waiter.done():  # a flush given up on (a cancelled commit)
                            waiter.set_exception(exc)
                    self._on_error(exc)
                    return
                for owner, transition in writes:
                    owner.writing -= 1
                    if owner.alive:
                        owner.engine.persisted(transition)
                for waiter in waiters:
                    if not waiter.done():  # a flush given up on (a cancelled commit)
                        waiter.set_result(None)
        except Exception as exc:  # a bug in an engine: give up on this runner
            self._on_error(exc)
        finally:
            self._task = None

    def _fence(
        self, writes: list[tuple[Owner, Transition]], delivered: dict[int, list[tuple[int, int]]]
    ) -> dict[int, int] | None:
        """The epochs to check; drops (in place) what belongs to partitions no longer owned."""
        if self._epoch_of is None:
            return None
        epochs: dict[int, int] = {}
        for partition in {t.write.partition for _, t in writes} | set(delivered):
            epoch = self._epoch_of(partition)
            if epoch is not None:
                epochs[partition] = epoch
        for partition in [p for p in delivered if p not in epochs]:
            del delivered[partition]
        kept = []
        for owner, transition in writes:
            if owner.alive and transition.write.partition in epochs:
                kept.append((owner, transition))
            else:
                owner.writing -= 1
        writes[:] = kept
        return epochs
