"""The worker's one timer for every runner's periodic work (delivery/ticker.py)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
import redis

from delivery.ticker import Periodic, Ticker


class Owner:
    def __init__(self, resting: bool = False) -> None:
        self.label = "subscription p/s"
        self.is_resting = resting
        self.failures: list[BaseException] = []

    def resting(self) -> bool:
        return self.is_resting

    def fail(self, error: BaseException) -> None:
        self.failures.append(error)


class Counted:
    """A work that does its part at once (returns None) and counts its rounds."""

    def __init__(self) -> None:
        self.rounds = 0

    def __call__(self) -> None:
        self.rounds += 1


async def until(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


async def test_every_work_runs_again_after_its_interval() -> None:
    ticker = Ticker()
    fast, slow = Counted(), Counted()
    ticket = ticker.add(Owner(), [Periodic(20, fast), Periodic(200, slow)])
    await until(lambda: slow.rounds >= 2)
    # The 20 ms work ran about ten times as often as the 200 ms one
    assert fast.rounds >= 5 * slow.rounds
    await ticker.remove(ticket)


async def test_a_thousand_owners_ticks_take_a_few_wake_ups_not_thousands(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a thousand owners with a 50 ms work each
    ticker = Ticker()
    fired = 0
    fire = ticker._fire

    def counted_fire() -> None:
        nonlocal fired
        fired += 1
        fire()

    monkeypatch.setattr(ticker, "_fire", counted_fire)
    works = [Counted() for _ in range(1000)]
    tickets = [ticker.add(Owner(), [Periodic(50, work)]) for work in works]
    # When every one of them has run five times
    await until(lambda: min(w.rounds for w in works) >= 5)
    # Then the timer fired about as often as one owner's work alone would have made it
    total = sum(w.rounds for w in works)
    assert fired < total / 100, (fired, total)
    for ticket in tickets:
        await ticker.remove(ticket)


async def test_a_work_waiting_on_io_never_runs_twice_at_once() -> None:
    ticker = Ticker()
    started = 0
    release = asyncio.Event()
    sentinel = Counted()

    async def slow() -> None:
        await release.wait()

    def work() -> Coroutine[Any, Any, None]:
        nonlocal started
        started += 1
        return slow()

    ticket = ticker.add(Owner(), [Periodic(10, work), Periodic(10, sentinel)])
    # While its first round waits, many of its intervals pass (the sentinel ticks)
    await until(lambda: sentinel.rounds >= 10)
    assert started == 1
    # Once it ends, it runs again
    release.set()
    await until(lambda: started >= 3)
    await ticker.remove(ticket)


async def test_a_resting_work_waits_for_records_and_runs_at_once_when_they_arrive(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("delivery.ticker.REST_S", 60.0)
    ticker = Ticker()
    owner = Owner(resting=True)
    rests, sentinel = Counted(), Counted()
    ticket = ticker.add(owner, [Periodic(10, rests, rests=True), Periodic(10, sentinel)])
    # While its owner rests, many of its intervals pass and it does not run
    await until(lambda: sentinel.rounds >= 10)
    assert rests.rounds == 0
    # Records arrive: it runs once, though its owner rests again at once
    ticker.wake(ticket)
    await until(lambda: rests.rounds == 1)
    before = sentinel.rounds
    await until(lambda: sentinel.rounds >= before + 10)
    assert rests.rounds == 1
    # An owner with work to do runs it every interval
    owner.is_resting = False
    ticker.wake(ticket)
    await until(lambda: rests.rounds >= 5)
    await ticker.remove(ticket)


async def test_a_resting_work_still_runs_once_per_rest(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("delivery.ticker.REST_S", 0.1)
    ticker = Ticker()
    rests, sentinel = Counted(), Counted()
    ticket = ticker.add(
        Owner(resting=True), [Periodic(10, rests, rests=True), Periodic(10, sentinel)]
    )
    await until(lambda: rests.rounds >= 3)
    # Every 100 ms, not every 10 ms
    assert sentinel.rounds >= 5 * rests.rounds
    await ticker.remove(ticket)


def failing(error: BaseException) -> Callable[[], None]:
    def work() -> None:
        raise error

    return work


async def test_a_patient_work_skips_rounds_while_redis_is_away_and_its_owner_goes_on() -> None:
    ticker = Ticker()
    owner = Owner()
    away = True
    rounds = 0

    def report() -> None:
        nonlocal rounds
        rounds += 1
        if away:
            raise redis.ConnectionError("No connection available.")

    ticket = ticker.add(owner, [Periodic(10, report)])
    await until(lambda: rounds >= 10)
    assert owner.failures == []
    away = False
    counted = rounds
    await until(lambda: rounds >= counted + 5)
    assert owner.failures == []
    await ticker.remove(ticket)


async def test_redis_away_past_the_patience_fails_the_owner_once_and_stops_its_works(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("delivery.ticker.PATIENCE_S", 0.1)
    ticker = Ticker()
    owner = Owner()
    error = redis.ConnectionError("No connection available.")
    other = Counted()
    ticker.add(owner, [Periodic(10, failing(error)), Periodic(10, other)])
    await until(lambda: bool(owner.failures))
    stopped_at = other.rounds
    sentinel = Counted()
    ticker.add(Owner(), [Periodic(10, sentinel)])
    await until(lambda: sentinel.rounds >= 10)
    assert owner.failures == [error]
    assert other.rounds <= stopped_at + 1


@pytest.mark.parametrize(
    ("error", "patient"),
    [(RuntimeError("a bug"), True), (redis.ConnectionError("away"), False)],
)
async def test_other_failures_and_impatient_works_fail_the_owner_at_once(
    error: BaseException, patient: bool
) -> None:
    ticker = Ticker()
    owner = Owner()

    async def fails() -> None:
        raise error

    ticker.add(owner, [Periodic(10, fails, patient=patient)])
    await until(lambda: bool(owner.failures))
    assert owner.failures == [error]


async def test_removing_an_owner_cancels_its_work_in_progress_and_waits_for_it() -> None:
    ticker = Ticker()
    ended = asyncio.Event()
    began = asyncio.Event()

    async def slow() -> None:
        began.set()
        try:
            await asyncio.sleep(60)
        finally:
            ended.set()

    ticket = ticker.add(Owner(), [Periodic(10, slow)])
    await asyncio.wait_for(began.wait(), 5)
    await asyncio.wait_for(ticker.remove(ticket), 5)
    assert ended.is_set()


async def test_a_resting_work_costs_one_firing_a_rest(monkeypatch: pytest.MonkeyPatch) -> None:
    # Given an owner that rests, and the timer's firings counted
    monkeypatch.setattr("delivery.ticker.REST_S", 0.05)
    ticker = Ticker()
    fired = 0
    fire = ticker._fire

    def counted() -> None:
        nonlocal fired
        fired += 1
        fire()

    ticker._fire = counted  # type: ignore[method-assign]
    rests = Counted()
    ticket = ticker.add(Owner(resting=True), [Periodic(10, rests, rests=True)])
    # When a work of 10 ms rests through several rests of 50 ms
    await until(lambda: rests.rounds >= 6)
    await ticker.remove(ticket)
    # Then each rest took one firing (the round, which put it back to rest), not one more at
    # its interval to find its owner resting
    assert fired <= rests.rounds + 1


async def test_a_round_that_did_something_is_followed_at_its_interval_before_it_rests(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a resting owner whose work has a commit to make once records came (then nothing),
    # and rests of a minute
    monkeypatch.setattr("delivery.ticker.REST_S", 60.0)
    ticker = Ticker()
    rounds: list[str] = []

    async def commit() -> None:
        rounds.append("commit")

    def work() -> Coroutine[Any, Any, None] | None:
        if not rounds:
            return commit()
        rounds.append("nothing")
        return None

    sentinel = Counted()
    ticket = ticker.add(
        Owner(resting=True), [Periodic(10, work, rests=True), Periodic(10, sentinel)]
    )
    # When records arrive once it rests: the round makes the commit, and the owner rests again
    # at once
    await until(lambda: ticket.sleeping)
    ticker.wake(ticket)
    # Then the work looks once more at its interval (finding nothing), and only then rests
    await until(lambda: len(rounds) >= 2)
    before = sentinel.rounds
    await until(lambda: sentinel.rounds >= before + 10)
    assert rounds == ["commit", "nothing"]
    await ticker.remove(ticket)


async def test_a_work_may_rest_longer_or_shorter_than_the_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("delivery.ticker.REST_S", 60.0)
    ticker = Ticker()
    own, sentinel = Counted(), Counted()
    ticket = ticker.add(
        Owner(resting=True),
        [Periodic(10, own, rests=True, rest_ms=100), Periodic(10, sentinel)],
    )
    # Its own rest of 100 ms, not the default minute
    await until(lambda: own.rounds >= 3)
    assert sentinel.rounds >= 5 * own.rounds
    await ticker.remove(ticket)


async def test_an_owner_that_raises_is_failed_and_the_others_go_on() -> None:
    class Broken(Owner):
        def resting(self) -> bool:
            raise RuntimeError("a bug")

    ticker = Ticker()
    broken = Broken()
    others = [Counted() for _ in range(5)]
    ticker.add(broken, [Periodic(10, Counted(), rests=True)])
    for work in others:
        ticker.add(Owner(), [Periodic(10, work)])
    await until(lambda: min(w.rounds for w in others) >= 5)
    assert [str(e) for e in broken.failures] == ["a bug"]
