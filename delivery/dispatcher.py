"""Webhook calls of one subscription, made by a fixed pool of ``max_in_flight`` coroutines.

A pool rather than a task per message: creating a task and queueing on a semaphore for every
message cost more CPU than the call itself on the target machine. Attempts go into one FIFO
queue; each pool coroutine takes the next, waits while the subscription is paused, skips it
when its partition is being drained or was given up (the record stays unfinished and is read
again by whoever owns the partition next), and hands the outcome to the partition's engine.

With a circuit breaker (delivery/breaker.py), a coroutine waits before each call until the
breaker lets it through, and an attempt the breaker gives back goes into the queue again
instead of to the engine: the engine sees one attempt, however long the outage.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Protocol

from delivery.breaker import HOLD_S, CircuitBreaker, Settlement
from delivery.engine import Attempt
from delivery.webhook import WebhookSender
from setu.clock import now_ms
from setu.outcome import Outcome

log = logging.getLogger(__name__)
COUNTED, GIVEN_BACK, HELD = Settlement.COUNTED, Settlement.GIVEN_BACK, Settlement.HELD


class Settles(Protocol):
    """Who is told a call's outcome: a partition's engine, or a replay's lane."""

    def on_result(self, attempt: Attempt, outcome: Outcome) -> None: ...


class Caller(Protocol):
    """What the pool needs of a partition: who settles its calls and whether calls may still
    start."""

    @property
    def engine(self) -> Settles: ...

    @property
    def alive(self) -> bool: ...

    @property
    def draining(self) -> bool: ...

    calling: int


class Dispatcher:
    """``size`` coroutines calling through ``sender``; see the module doc."""

    def __init__(
        self,
        sender: WebhookSender,
        gate: asyncio.Event,
        size: int,
        on_error: Callable[[BaseException], None],
        observe: Callable[[Attempt, Outcome, float], None] | None = None,
        breaker: CircuitBreaker | None = None,
    ) -> None:
        """``observe`` is told every call's outcome and duration in seconds (metrics, the
        attempt log)."""
        self._sender = sender
        self._breaker = breaker
        self._observe = observe
        self._gate = gate
        self._on_error = on_error
        self._queue: asyncio.Queue[tuple[Caller, Attempt]] = asyncio.Queue()
        self._workers: set[asyncio.Task[None]] = set()
        self._excess = 0  # coroutines to retire after their current call
        self.holding = 0  # attempts the pool's coroutines hold (waiting to call, or calling)
        self.size = 0
        self.resize(size)

    def submit(self, caller: Caller, attempt: Attempt) -> None:
        """Queues a call; one with ``not_before_ms`` in the future is queued at that time."""
        wait_ms = attempt.not_before_ms - now_ms() if attempt.not_before_ms else 0
        if wait_ms > 0:
            asyncio.get_running_loop().call_later(
                wait_ms / 1000, self._queue.put_nowait, (caller, attempt)
            )
        else:
            self._queue.put_nowait((caller, attempt))

    def demand(self) -> int:
        """Attempts that want a call now: queued, or held by the pool's coroutines."""
        return self._queue.qsize() + self.holding

    def resize(self, size: int) -> None:
        """Grows the pool at once; shrinking happens as coroutines finish their calls."""
        self.size = size
        current = len(self._workers) - self._excess
        if size < current:
            self._excess += current - size
            return
        kept = min(self._excess, size - current)
        self._excess -= kept
        loop = asyncio.get_running_loop()
        for _ in range(size - current - kept):
            task = loop.create_task(self._work())
            self._workers.add(task)
            task.add_done_callback(self._workers.discard)

    async def close(self) -> None:
        for task in self._workers:
            task.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)

    async def _work(self) -> None:
        queue = self._queue
        while True:
            if self._excess:
                self._excess -= 1
                return
            caller, attempt = await queue.get()
            if self._excess:
                # The pool shrank while this coroutine waited: leave the call to another.
                self._excess -= 1
                queue.put_nowait((caller, attempt))
                return
            self.holding += 1
            try:
                breaker = self._breaker
                if self._gate.is_set() and (breaker is None or breaker.closed):
                    probe = False  # the hot path: nothing to wait for
                else:
                    probe = await self._admit()
                await self._call(caller, attempt, probe)
            finally:
                self.holding -= 1

    async def _admit(self) -> bool:
        """Waits while the subscription is paused or the breaker open; True: a probe."""
        gate, breaker = self._gate, self._breaker
        while True:
            if not gate.is_set():
                await gate.wait()
            if breaker is None:
                return False
            probe = await breaker.admit()
            if gate.is_set():
                return probe
            if probe:
                breaker.cancel_probe()  # paused while waiting for the breaker

    async def _call(self, caller: Caller, attempt: Attempt, probe: bool) -> None:
        breaker = self._breaker
        if caller.draining or not caller.alive:
            if probe:
                assert breaker is not None
                breaker.cancel_probe()
            return
        caller.calling += 1
        started = time.perf_counter()
        try:
            outcome: Outcome = await self._sender.send(
                attempt.record.envelope, attempt.number, attempt.replay
            )
        except Exception as exc:  # a bug, not a failed call: those are outcomes
            caller.calling -= 1
            self._on_error(exc)
            raise
        verdict = COUNTED if breaker is None else breaker.record(outcome, probe)
        if verdict is HELD:
            # May be the start of an outage: decided a little later (delivery/breaker.py).
            # Until then the attempt still counts as calling, so a partition being given up
            # waits for its outcome: dropped, the partition's next owner would make the same
            # attempt again at once, without its backoff.
            asyncio.get_running_loop().call_later(
                HOLD_S, self._settle, caller, attempt, outcome, time.perf_counter() - started
            )
            return
        caller.calling -= 1
        self._finish(caller, attempt, outcome, verdict, time.perf_counter() - started)

    def _settle(self, caller: Caller, attempt: Attempt, outcome: Outcome, seconds: float) -> None:
        assert self._breaker is not None
        caller.calling -= 1
        self._finish(caller, attempt, outcome, self._breaker.settle(), seconds)

    def _finish(
        self,
        caller: Caller,
        attempt: Attempt,
        outcome: Outcome,
        verdict: Settlement,
        seconds: float,
    ) -> None:
        given_back = verdict is GIVEN_BACK
        if self._observe is not None:
            self._observe(
                attempt, replace(outcome, given_back=True) if given_back else outcome, seconds
            )
        if given_back:
            if caller.alive and not caller.draining:
                self._queue.put_nowait((caller, attempt))  # the same attempt, again
            return
        if caller.alive:
            try:
                caller.engine.on_result(attempt, outcome)
            except Exception as exc:
                self._on_error(exc)
                raise
