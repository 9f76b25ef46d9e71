"""The circuit breaker's decisions (delivery/breaker.py), and its waiting on the event loop."""

from __future__ import annotations

import asyncio

from delivery.breaker import BreakerRules, BreakerState, CircuitBreaker, Settlement
from setu.outcome import Outcome, Verdict
from setu.policies import BreakerPolicy

POLICY = BreakerPolicy(failure_ratio=0.5, min_calls=4, window_s=10, open_s=5)


def watched() -> tuple[CircuitBreaker, list[int], list[str]]:
    """A breaker of ``POLICY`` on a clock the test sets (``now[0]``, ms, from 0), and the
    states it changed to."""
    now = [0]
    changes: list[str] = []
    breaker = CircuitBreaker(
        POLICY, "s", clock=lambda: now[0], on_change=lambda v: changes.append(v.state.value)
    )
    return breaker, now, changes


OK = Outcome(Verdict.DELIVERED, status=200)
DOWN = Outcome(Verdict.RETRY, error="connection refused")
BUSY = Outcome(Verdict.RETRY, status=503)
REJECTED = Outcome(Verdict.DEAD_LETTER, status=400)
REFUSED = Outcome(Verdict.DEAD_LETTER, error="address not allowed", refused=True)


def test_it_opens_at_the_failure_ratio_over_enough_calls_and_gives_the_tripping_call_back() -> None:
    rules = BreakerRules(POLICY, 0)
    # Given three failures: fewer calls than min_calls, so the breaker stays closed
    assert [rules.record(DOWN, False, t) for t in (0, 100, 200)] == [False] * 3
    assert rules.state is BreakerState.CLOSED
    # When a fourth fails, half or more of four calls failed: it opens, and that call's
    # attempt is given back
    assert rules.record(BUSY, False, 300) is True
    view = rules.view()
    assert (view.state, view.since_ms, view.last_error) == (BreakerState.OPEN, 300, "HTTP 503")
    assert view.outage_since_ms == 300
    # And calls still in flight that fail are given back too; a success is not
    assert rules.record(DOWN, False, 400) is True
    assert rules.record(OK, False, 450) is False
    assert rules.view().given_back == 2


def test_successes_and_answers_that_are_not_outages_keep_it_closed() -> None:
    rules = BreakerRules(POLICY, 0)
    for t, outcome in enumerate([DOWN, OK, REJECTED, OK, DOWN, REFUSED, REFUSED, REFUSED]):
        assert rules.record(outcome, False, t) is False
    # 2 failures of 6 counted calls (refusals say nothing about the endpoint)
    assert rules.state is BreakerState.CLOSED


def test_old_calls_leave_the_sliding_window() -> None:
    rules = BreakerRules(POLICY, 0)
    for t in (0, 1000, 2000):
        rules.record(DOWN, False, t)
    rules.record(OK, False, 2500)
    # 10 s later those failures are out of the window: one more failure is 1 of 1 call
    assert rules.record(DOWN, False, 12_500) is False
    assert rules.state is BreakerState.CLOSED


def test_min_calls_failures_in_a_row_open_it_after_a_healthy_spell() -> None:
    # Given a window full of successes, whose share of failures a sudden outage cannot
    # reach for seconds
    rules = BreakerRules(POLICY, 0)
    for t in range(100):
        rules.record(OK, False, t)
    # When min_calls calls in a row fail, it opens all the same
    assert [rules.record(DOWN, False, 200 + t) for t in range(4)] == [False] * 3 + [True]
    assert rules.state is BreakerState.OPEN


def test_open_waits_then_lets_one_probe_through_which_closes_or_reopens_it() -> None:
    rules = BreakerRules(POLICY, 0)
    for t in range(4):
        rules.record(DOWN, False, t)
    # While open nothing may start
    assert rules.may_call(4_000) is False
    # After open_s one call is the probe, the others wait behind it
    assert rules.may_call(5_003) is True
    assert rules.state is BreakerState.HALF_OPEN
    assert rules.may_call(5_004) is False
    # A failed probe opens the breaker again for open_s, and its attempt is given back too
    assert rules.record(DOWN, True, 5_100) is True
    assert (rules.state, rules.since_ms) == (BreakerState.OPEN, 5_100)
    assert rules.view().outage_since_ms == 3  # the same outage goes on
    assert rules.may_call(10_099) is False
    assert rules.may_call(10_100) is True
    # A successful probe closes it and ends the outage
    assert rules.record(OK, True, 10_200) is False
    view = rules.view()
    assert (view.state, view.outage_since_ms, view.opened, view.probes) == (
        BreakerState.CLOSED,
        None,
        2,
        2,
    )
    assert rules.may_call(10_201) is None


def test_a_probe_that_was_not_made_lets_the_next_one_through() -> None:
    rules = BreakerRules(POLICY, 0)
    for t in range(4):
        rules.record(DOWN, False, t)
    assert rules.may_call(6_000) is True
    rules.cancel_probe()
    assert rules.may_call(6_001) is True


def test_no_policy_means_no_breaker_and_removing_it_closes_an_open_one() -> None:
    off = BreakerRules(None, 0)
    assert not any(off.record(DOWN, False, t) for t in range(100))
    assert off.may_call(100) is None
    rules = BreakerRules(POLICY, 0)
    for t in range(4):
        rules.record(DOWN, False, t)
    rules.update(None, 10)
    assert rules.state is BreakerState.CLOSED
    assert rules.may_call(11) is None


def test_callers_wait_while_open_and_go_once_a_probe_closes_it() -> None:
    async def scenario() -> list[str]:
        breaker, now, changes = watched()
        for _ in range(4):
            breaker.record(DOWN, False)
        now[0] = 4_950  # the waiters' timers run out 50 ms from now
        waiting = [asyncio.ensure_future(breaker.admit()) for _ in range(3)]
        await asyncio.sleep(0)
        assert not any(w.done() for w in waiting)
        # When open_s has passed (the waiters' timers fire), exactly one is the probe
        now[0] = 5_000
        await asyncio.wait(waiting, timeout=2, return_when=asyncio.FIRST_COMPLETED)
        done = [w for w in waiting if w.done()]
        assert [w.result() for w in done] == [True]
        # When the probe succeeds, the others go as ordinary calls
        breaker.record(OK, True)
        rest = await asyncio.wait_for(asyncio.gather(*[w for w in waiting if w not in done]), 1)
        assert rest == [False, False]
        return changes

    assert asyncio.run(scenario()) == ["open", "half_open", "closed"]


def test_another_workers_word_opens_a_closed_breaker_and_its_end_closes_it() -> None:
    rules = BreakerRules(POLICY, 0)
    # When another worker says the endpoint has been down since t=100
    rules.adopt(1_000, 100, "HTTP 502")
    view = rules.view()
    assert (view.state, view.since_ms, view.outage_since_ms, view.last_error) == (
        BreakerState.OPEN,
        1_000,
        100,
        "HTTP 502",
    )
    # Then it waits open_s like its own, and calls that come back failed are given back
    assert rules.adopted and rules.may_call(5_999) is False
    assert rules.record(DOWN, False, 2_000) is True
    # And when the word goes, it closes
    rules.release(3_000)
    assert (rules.state, rules.adopted, rules.view().outage_since_ms) == (
        BreakerState.CLOSED,
        False,
        None,
    )


def test_a_failed_probe_makes_an_adopted_breaker_its_own_and_open_ones_ignore_words() -> None:
    rules = BreakerRules(POLICY, 0)
    rules.adopt(0, 0, "HTTP 503")
    assert rules.may_call(5_000) is True
    rules.record(DOWN, True, 5_100)
    assert rules.state is BreakerState.OPEN and not rules.adopted
    rules.adopt(6_000, 3, "other")  # already open: nothing changes
    assert (rules.since_ms, rules.view().outage_since_ms) == (5_100, 0)
    off = BreakerRules(None, 0)
    off.adopt(0, 0, "HTTP 503")  # no breaker: nothing to open
    assert off.state is BreakerState.CLOSED


def test_failures_that_may_start_an_outage_are_held_and_given_back_when_it_opens() -> None:
    async def scenario() -> list[Settlement]:
        now = [0]
        breaker = CircuitBreaker(POLICY, "s", clock=lambda: now[0])
        seen = [breaker.record(DOWN, False), breaker.record(DOWN, False)]
        # A success brings the window's ratio to 2 of 3: still suspicious
        seen.append(breaker.record(OK, False))
        # When the fourth failure opens the breaker, it is given back, and so are the held
        seen.append(breaker.record(DOWN, False))
        seen += [breaker.settle(), breaker.settle()]
        return seen

    assert asyncio.run(scenario()) == [
        Settlement.HELD,
        Settlement.HELD,
        Settlement.COUNTED,
        Settlement.GIVEN_BACK,
        Settlement.GIVEN_BACK,
        Settlement.GIVEN_BACK,
    ]


def test_a_held_failure_counts_when_nothing_opens_and_a_failed_probe_tells_no_new_opening() -> None:
    async def scenario() -> tuple[list[Settlement], list[str]]:
        breaker, _, changes = watched()
        for _ in range(3):
            breaker.record(OK, False)
        seen = [breaker.record(DOWN, False), breaker.settle()]  # held, then nothing opened
        return seen, changes

    assert asyncio.run(scenario()) == ([Settlement.HELD, Settlement.COUNTED], [])

    async def probes() -> list[str]:
        breaker, now, changes = watched()
        for _ in range(4):
            breaker.record(DOWN, False)
        now[0] = 5_000
        assert await breaker.admit() is True
        breaker.record(DOWN, True)  # the probe fails: open again, the same outage
        return changes

    assert asyncio.run(probes()) == ["open", "half_open"]


def test_a_successful_probe_is_never_held_and_a_late_probe_answer_opens_nothing() -> None:
    async def scenario() -> tuple[Settlement, Settlement, BreakerState]:
        now = [0]
        breaker = CircuitBreaker(POLICY, "s", clock=lambda: now[0])
        for _ in range(4):
            breaker.record(DOWN, False)
        now[0] = 5_000
        assert await breaker.admit() is True
        # A held success given back would be sent again: a duplicate 2xx
        first = breaker.record(OK, True)
        # A probe whose breaker closed meanwhile (released) answers like any call: one
        # failure opens nothing
        for _ in range(4):
            breaker.record(DOWN, False)
        now[0] = 10_000
        assert await breaker.admit() is True
        breaker.release()
        late = breaker.record(DOWN, True)
        return first, late, breaker.rules.state

    assert asyncio.run(scenario()) == (
        Settlement.COUNTED,
        Settlement.HELD,
        BreakerState.CLOSED,
    )
