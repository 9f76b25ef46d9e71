"""A subscription's guards on one worker: the policy pause, breaker events and the share of
max_in_flight (delivery/guards.py)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Coroutine
from typing import Any

import pytest

from delivery import guards as guards_module
from delivery.breaker import BreakerState
from delivery.guards import SLOT_DORMANT_MS, SubscriptionGuards
from delivery.metrics import DeliveryMetrics
from delivery.watch import Watched
from setu.outcome import Outcome, Verdict
from setu.policies import DeadLetterWindow, Policies
from state.delivery_budget import SLOT_ENTRY_TTL_MS, SLOT_IDLE_TTL_MS
from tests.unit.delivery.sim import subscription


class Recorder:
    def __init__(self, fail_first: int = 0) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.pauses: list[str] = []
        self.fail_first = fail_first

    def emit(self, kind: str, data: dict[str, Any]) -> None:
        self.events.append((kind, data))

    async def pause(self, reason: str) -> None:
        if self.fail_first:
            self.fail_first -= 1
            raise ConnectionError("the store is away")
        self.pauses.append(reason)


def guards(recorder: Recorder, **options: Any) -> SubscriptionGuards:
    window = Policies(dead_letter_window=DeadLetterWindow(size=4, threshold=2))
    sub = dataclasses.replace(subscription(), policies=window)
    tasks: list[Coroutine[Any, Any, None]] = []
    return SubscriptionGuards(
        sub,
        "w",
        DeliveryMetrics().subscription("p", "s"),
        recorder.emit,
        tasks.append,
        pause=recorder.pause,
        **options,
    )


async def test_a_broken_policy_pauses_once_and_a_failed_store_is_asked_again() -> None:
    # Given a dead-letter window of 4 with a threshold of 2, and a store that fails once
    recorder = Recorder(fail_first=1)
    guarded = guards(recorder)
    for dead in (True, True, True, False):
        guarded.autopause.finished(dead)
    # When the policies are checked: the first pause fails, the next check pauses
    await guarded.check(paused=False)
    assert recorder.pauses == []
    await guarded.check(paused=False)
    [reason] = recorder.pauses
    assert reason.startswith("dead_letter_window: 3 of the last 4")
    assert recorder.events == [("subscription.paused", {"reason": reason})]
    # And while that pause is on its way to every worker, it is not asked for again
    await guarded.check(paused=False)
    assert len(recorder.pauses) == 1


async def test_a_paused_subscription_is_not_paused_again() -> None:
    recorder = Recorder()
    guarded = guards(recorder)
    for _ in range(4):
        guarded.autopause.finished(True)
    await guarded.check(paused=True)
    assert recorder.pauses == []


async def test_the_breaker_opening_and_closing_are_events() -> None:
    recorder = Recorder()
    guarded = guards(recorder)
    breaker = guarded.breaker
    assert breaker.rules.state is BreakerState.CLOSED
    for _ in range(20):
        breaker.record(Outcome(Verdict.RETRY, status=503), probe=False)
    assert [kind for kind, _ in recorder.events] == ["endpoint.breaker_opened"]
    assert recorder.events[0][1]["state"] == "open"


async def test_the_share_of_max_in_flight_resizes_the_pool() -> None:
    class Budget:
        async def share(
            self, worker: str, demand: int, busy: int, limit: int, ttl_ms: int = 3000
        ) -> int:
            self.asked = (worker, demand, busy, limit)
            return 7

    class Pool:
        size = 2

        def demand(self) -> int:
            return 3

        def resize(self, size: int) -> None:
            self.size = size

    budget, pool = Budget(), Pool()
    guarded = guards(Recorder(), budget=budget)
    await guarded.renew_slots(pool, busy=1)  # type: ignore[arg-type]
    # It asked for what it wants going, with headroom, and took what it was granted
    # (holding its pool of 2 while it asks, though 1 call is going)
    assert budget.asked == ("w", min(256, 3 + 4), 2, guarded.sub.max_in_flight)
    assert pool.size == 7


async def test_a_pool_asking_for_less_holds_its_size_until_it_shrank() -> None:
    # A regression: the pool said only the calls going when it asked, and started more with
    # its earlier size while the answer was on its way; another worker was granted them too
    # (4 calls at an endpoint allowing 3, across three workers)
    class Budget:
        def __init__(self) -> None:
            self.said_busy: list[int] = []

        async def share(
            self, worker: str, demand: int, busy: int, limit: int, ttl_ms: int = 3000
        ) -> int:
            self.said_busy.append(busy)
            return 1

    class Pool:
        size = 3  # granted before
        calling = 0

        def demand(self) -> int:
            return 5  # records just arrived: nothing calling yet

        def resize(self, size: int) -> None:
            self.size = size

    budget, pool = Budget(), Pool()
    guarded = guards(Recorder(), budget=budget)
    # When the worker asks while no call is going yet, it holds its pool's 3
    await guarded.renew_slots(pool, busy=pool.calling)  # type: ignore[arg-type]
    assert (budget.said_busy, pool.size) == ([3], 1)
    # Then, shrunk to its grant with one call going, it says so
    await guarded.renew_slots(pool, busy=1)  # type: ignore[arg-type]
    assert budget.said_busy == [3, 1]


class GrantingBudget:
    """A budget that grants every ask in full, recording the asks and their entries' TTLs."""

    def __init__(self) -> None:
        self.asks: list[int] = []
        self.ttls: list[int] = []

    async def share(
        self, worker: str, demand: int, busy: int, limit: int, ttl_ms: int = 3000
    ) -> int:
        self.asks.append(demand)
        self.ttls.append(ttl_ms)
        return demand


class DemandPool:
    """A dispatcher pool reduced to its demand and size."""

    size = 0
    wanted = 0

    def demand(self) -> int:
        return self.wanted

    def resize(self, size: int) -> None:
        self.size = size


async def test_an_idle_share_is_renewed_seldom_and_a_change_at_once() -> None:
    budget, pool = GrantingBudget(), DemandPool()
    guarded = guards(Recorder(), budget=budget)
    # An idle subscription's tick comes four times a second: only the first writes its share
    for _ in range(4):
        await guarded.renew_slots(pool, busy=0)  # type: ignore[arg-type]
    assert budget.asks == [4]
    # A change (records waiting) is asked for at once
    pool.wanted = 10
    await guarded.renew_slots(pool, busy=0)  # type: ignore[arg-type]
    assert budget.asks == [4, 20]
    # And the idle entry was written to last longer than a busy one
    assert budget.ttls == [SLOT_IDLE_TTL_MS, SLOT_ENTRY_TTL_MS]


async def test_another_workers_open_breaker_is_adopted_from_the_workers_reading() -> None:
    class Budget:
        def __init__(self) -> None:
            self.reads = 0

        async def shared_breaker(self) -> dict[str, Any] | None:
            self.reads += 1
            return None

        async def publish_breaker(self, view: dict[str, Any], ttl_ms: int) -> None:
            pass

    budget = Budget()
    guarded = guards(Recorder(), budget=budget)
    # Given the worker's fresh reading of Redis: another worker's breaker is open
    opened = {"state": "open", "since_ms": 1, "failures": 5, "probe_at_ms": 10**13}
    guarded.watched = Watched("p", "s", None, breaker=opened, read_at=time.monotonic())
    # When the policy check runs
    await guarded.check(paused=False)
    # Then the breaker is adopted from the reading, and Redis was not asked
    assert guarded.breaker.rules.state is BreakerState.OPEN
    assert budget.reads == 0
    # And once the reading is stale (the worker's watch away), the check asks Redis itself
    guarded.watched.read_at -= 60
    await guarded.check(paused=False)
    assert budget.reads == 1


async def test_a_breaker_that_closed_does_not_open_again_on_a_word_older_than_its_close() -> None:
    class Budget:
        async def shared_breaker(self) -> dict[str, Any] | None:
            return None

        async def publish_breaker(self, view: dict[str, Any], ttl_ms: int) -> None:
            pass

        async def close_breaker(self, at_ms: int, ttl_ms: int) -> None:
            pass

    guarded = guards(Recorder(), budget=Budget())
    rules = guarded.breaker.rules
    # Given this worker's breaker open since t=1000, its word published, then closed by a
    # probe at t=5000
    rules._move(BreakerState.OPEN, 1000)
    rules._close(5000)
    own_word = {"state": "open", "since_ms": 1000, "failures": 5, "probe_at_ms": 10**13}
    # When the worker's reading, a second old, still holds that word
    guarded.watched = Watched("p", "s", None, breaker=own_word, read_at=time.monotonic())
    await guarded.check(paused=False)
    # Then the breaker stays closed
    assert rules.state is BreakerState.CLOSED
    # And an outage another worker found after that close is adopted
    newer = {**own_word, "since_ms": 6000}
    guarded.watched = Watched("p", "s", None, breaker=newer, read_at=time.monotonic())
    await guarded.check(paused=False)
    assert rules.state is BreakerState.OPEN


async def test_a_long_idle_share_is_given_back_and_asked_again_when_calls_are_wanted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = [1_000_000]
    monkeypatch.setattr(guards_module, "now_ms", lambda: clock[0])
    budget, pool = GrantingBudget(), DemandPool()
    guarded = guards(Recorder(), budget=budget)
    # Given an idle subscription holding its headroom
    await guarded.renew_slots(pool, busy=0)  # type: ignore[arg-type]
    assert budget.asks == [4] and pool.size == 4
    # When it stays idle past the dormant time, renewed every few seconds meanwhile
    for _ in range(SLOT_DORMANT_MS // 2_500):
        clock[0] += 2_500
        await guarded.renew_slots(pool, busy=0)  # type: ignore[arg-type]
    # Then it gave its share back once, and renews nothing more while idle
    assert budget.asks[-1] == 0 and pool.size == 0
    asked = len(budget.asks)
    for _ in range(100):
        clock[0] += 2_500
        await guarded.renew_slots(pool, busy=0)  # type: ignore[arg-type]
    assert len(budget.asks) == asked
    # And a record wanting a call asks for a share at once, with headroom
    pool.wanted = 1
    await guarded.renew_slots(pool, busy=0)  # type: ignore[arg-type]
    assert budget.asks[-1] == 5 and pool.size == 5
