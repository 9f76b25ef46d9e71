"""The dispatcher pool: how many calls run at once, pausing, and partitions being drained."""

from __future__ import annotations

import asyncio
from typing import Any

from delivery.dispatcher import Dispatcher
from delivery.engine import Attempt
from setu.envelope import Envelope
from setu.ordering.records import Record
from setu.outcome import Outcome, Verdict


class Sender:
    """Counts concurrent calls; each takes ``delay`` seconds."""

    def __init__(self, delay: float = 0.01) -> None:
        self.delay = delay
        self.active = 0
        self.most = 0
        self.sent: list[str] = []

    async def send(self, envelope: Envelope, attempt: int, replay: str | None = None) -> Outcome:
        self.active += 1
        self.most = max(self.most, self.active)
        await asyncio.sleep(self.delay)
        self.active -= 1
        self.sent.append(envelope.message_id)
        return Outcome(Verdict.DELIVERED, status=200)


class Caller:
    def __init__(self) -> None:
        self.alive = True
        self.draining = False
        self.calling = 0
        self.results: list[str] = []
        self.engine: Any = self

    def on_result(self, attempt: Attempt, outcome: Outcome) -> None:
        self.results.append(attempt.record.message_id)


def attempt(n: int, not_before_ms: int = 0) -> Attempt:
    return Attempt(0, Record(0, n, Envelope(f"m{n}", b"")), 1, False, not_before_ms)


async def settle_within(predicate: Any, seconds: float) -> None:
    async with asyncio.timeout(seconds):
        while not predicate():  # noqa: ASYNC110 (a deadline-bound poll of plain state)
            await asyncio.sleep(0.005)


async def settle(predicate: Any) -> None:
    """Polls ``predicate`` until it holds, for at most two seconds."""
    await settle_within(predicate, 2.0)


async def test_at_most_size_calls_run_at_once_and_all_outcomes_come_back() -> None:
    sender, caller, gate = Sender(), Caller(), asyncio.Event()
    gate.set()
    pool = Dispatcher(sender, gate, 3, lambda exc: None)  # type: ignore[arg-type]
    for n in range(12):
        pool.submit(caller, attempt(n))
    await settle(lambda: len(caller.results) == 12)
    assert sender.most == 3
    assert sorted(caller.results) == sorted(f"m{n}" for n in range(12))
    await pool.close()


async def test_a_closed_gate_holds_calls_until_it_opens() -> None:
    sender, caller, gate = Sender(), Caller(), asyncio.Event()
    pool = Dispatcher(sender, gate, 2, lambda exc: None)  # type: ignore[arg-type]
    pool.submit(caller, attempt(1))
    await asyncio.sleep(0.05)
    assert sender.sent == []
    gate.set()
    await settle(lambda: caller.results == ["m1"])
    await pool.close()


async def test_calls_of_a_draining_partition_are_dropped_unsent() -> None:
    sender, caller, gate = Sender(), Caller(), asyncio.Event()
    gate.set()
    caller.draining = True
    pool = Dispatcher(sender, gate, 2, lambda exc: None)  # type: ignore[arg-type]
    pool.submit(caller, attempt(1))
    await asyncio.sleep(0.05)
    assert (sender.sent, caller.results, caller.calling) == ([], [], 0)
    await pool.close()


async def test_the_pool_grows_and_shrinks() -> None:
    sender, caller, gate = Sender(0.02), Caller(), asyncio.Event()
    gate.set()
    pool = Dispatcher(sender, gate, 1, lambda exc: None)  # type: ignore[arg-type]
    pool.resize(4)
    for n in range(8):
        pool.submit(caller, attempt(n))
    await settle(lambda: len(caller.results) == 8)
    assert sender.most == 4
    pool.resize(2)
    sender.most = 0
    for n in range(8, 16):
        pool.submit(caller, attempt(n))
    await settle(lambda: len(caller.results) == 16)
    assert sender.most <= 3  # coroutines retire after their current call
    await settle(lambda: len(pool._workers) == 2)
    await pool.close()


async def test_a_call_with_a_future_start_waits_for_it() -> None:
    from setu.clock import now_ms

    sender, caller, gate = Sender(0.0), Caller(), asyncio.Event()
    gate.set()
    pool = Dispatcher(sender, gate, 2, lambda exc: None)  # type: ignore[arg-type]
    started = now_ms()
    pool.submit(caller, attempt(1, not_before_ms=started + 100))
    await settle(lambda: caller.results == ["m1"])
    assert now_ms() - started >= 90
    await pool.close()


async def test_every_call_is_observed_with_its_outcome_and_duration() -> None:
    # Given a pool that reports calls to an observer
    sender, caller, gate = Sender(delay=0.001), Caller(), asyncio.Event()
    gate.set()
    seen: list[tuple[int, Verdict, float]] = []
    done = asyncio.Event()

    def observe(made: Attempt, outcome: Outcome, seconds: float) -> None:
        seen.append((made.record.offset, outcome.verdict, seconds))
        if len(seen) == 3:
            done.set()

    pool = Dispatcher(sender, gate, 2, lambda exc: None, observe)  # type: ignore[arg-type]
    # When three calls are made
    for n in range(3):
        pool.submit(caller, attempt(n))
    await asyncio.wait_for(done.wait(), 5)
    await pool.close()
    # Then each was observed once, with how long it took
    assert sorted(offset for offset, _, _ in seen) == [0, 1, 2]
    assert [verdict for _, verdict, _ in seen] == [Verdict.DELIVERED] * 3
    assert all(seconds >= 0.001 for _, _, seconds in seen)


class Down(Sender):
    """An endpoint that is down: every call 503."""

    async def send(self, envelope: Envelope, attempt: int, replay: str | None = None) -> Outcome:
        await super().send(envelope, attempt)
        return Outcome(Verdict.RETRY, status=503)


async def test_an_outage_opens_the_breaker_and_the_held_failures_are_given_back() -> None:
    from delivery.breaker import CircuitBreaker
    from setu.policies import BreakerPolicy

    # Given a breaker that opens on 3 failures in a row, and a dead endpoint
    breaker = CircuitBreaker(BreakerPolicy(0.5, 3, 10, 60), "s")
    sender, caller, gate = Down(), Caller(), asyncio.Event()
    gate.set()
    pool = Dispatcher(sender, gate, 8, lambda exc: None, breaker=breaker)  # type: ignore[arg-type]
    # When three messages are called
    for n in range(3):
        pool.submit(caller, attempt(n))
    await settle(lambda: len(sender.sent) == 3)
    # Then the breaker opened, and no failure reached the engine: each was held, then given
    # back, and waits for the breaker in the pool
    assert not breaker.closed
    await settle_within(lambda: breaker.rules.given_back == 3, 3.0)  # after the hold
    # (a given-back attempt is queued first, then taken by one of the pool's coroutines)
    await settle(lambda: pool.holding == 3)
    assert caller.results == []
    assert len(sender.sent) == 3  # none was called again while the breaker is open
    await pool.close()


async def test_a_held_failure_counts_as_calling_until_it_reaches_the_engine() -> None:
    from delivery.breaker import HOLD_S, CircuitBreaker
    from setu.policies import BreakerPolicy

    # Given a closed breaker that needs 3 failures to open, and a dead endpoint
    breaker = CircuitBreaker(BreakerPolicy(0.5, 3, 10, 60), "s")
    sender, caller, gate = Down(), Caller(), asyncio.Event()
    gate.set()
    pool = Dispatcher(sender, gate, 8, lambda exc: None, breaker=breaker)  # type: ignore[arg-type]
    # When one call fails: its failure is held, since it may be the start of an outage
    pool.submit(caller, attempt(1))
    await settle(lambda: sender.sent == ["m1"])
    # Then while it is held the partition still counts it as calling (a partition being
    # given up drains until it is 0; the outcome must reach its engine first)
    await asyncio.sleep(HOLD_S / 2)
    assert (caller.calling, caller.results) == (1, [])
    # And once the hold is over the failure reaches the engine, and nothing is calling
    await settle_within(lambda: caller.results == ["m1"], 2 * HOLD_S)
    assert caller.calling == 0
    await pool.close()


async def test_a_pool_given_back_to_nothing_holds_its_calls_and_makes_them_once_granted() -> None:
    # Given an idle pool whose share was given back (delivery/guards.py, SLOT_DORMANT_MS)
    sender, caller, gate = Sender(), Caller(), asyncio.Event()
    gate.set()
    pool = Dispatcher(sender, gate, 4, lambda exc: None)  # type: ignore[arg-type]
    await asyncio.sleep(0)  # its coroutines wait for calls
    pool.resize(0)
    # When calls arrive before the next share is granted
    for n in range(3):
        pool.submit(caller, attempt(n))
    # Then none is made (the worker holds no slot), yet all are wanted
    await settle(lambda: len(pool._workers) == 0)
    assert sender.sent == [] and pool.demand() == 3
    # And once a share is granted, every one of them is made
    pool.resize(5)
    await settle(lambda: len(caller.results) == 3)
    assert sorted(sender.sent) == ["m0", "m1", "m2"]
    await pool.close()
