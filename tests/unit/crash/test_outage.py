"""The crash test's endpoint outage: the plan's answer and the report's figures."""

from __future__ import annotations

import dataclasses

from bench.crash.outage import outage_figures
from bench.crash.plan import (
    OUTAGE_STRETCH,
    FailurePlan,
    FailureSchedule,
    Phase,
    PlanShape,
    decide_status,
    make_plan,
)


def test_every_call_fails_inside_the_outage_which_opens_at_the_first_call_due() -> None:
    plan = FailurePlan(outage=(1_000, 2_000), flaky={"g": 1})
    schedule = FailureSchedule(plan)
    assert decide_status(schedule, Phase.RUN, "h", "m", 999) == 200
    # No call came at 1,000: the outage opens with the first call after it, for its length
    assert decide_status(schedule, Phase.RUN, "h", "m", 1_500) == 503
    assert schedule.outage_started == 1_500
    assert decide_status(schedule, Phase.RUN, "g", "m", 2_499, calls_before=5) == 503
    assert decide_status(schedule, Phase.RUN, "h", "m", 2_500) == 200
    assert decide_status(schedule, Phase.DRAIN, "h", "m", 2_000) == 200
    assert FailurePlan.from_json(plan.to_json()) == plan


def test_the_plan_places_the_outage_inside_the_run() -> None:
    shape = PlanShape("r", groups=10, lanes=2, messages_per_lane=5, start_ms=0, span_ms=100_000)
    assert make_plan(shape, 1).outage is None
    with_outage = dataclasses.replace(shape, outage_ms=12_000)
    assert make_plan(with_outage, 1).outage == (40_000, 52_000)


def call(t: int, mid: str, attempt: int, status: int) -> dict[str, object]:
    return {"t": t, "mid": mid, "attempt": str(attempt), "status": status}


def test_given_back_calls_spend_nothing_and_counted_ones_do() -> None:
    calls = [
        call(1_000, "a", 1, 503),  # counted: a's next call is attempt 2
        call(1_100, "b", 1, 503),  # given back: b's next call is attempt 1 again
        call(1_500, "a", 2, 503),  # given back
        call(1_900, "b", 1, 503),  # given back (its next call comes after the outage)
        call(2_500, "a", 2, 200),
        call(2_600, "b", 1, 200),
    ]
    events = [
        {"type": "outage.started", "at_ms": 1_000},
        {"type": "endpoint.breaker_opened", "at_ms": 1_200},
        {"type": "endpoint.breaker_closed", "at_ms": 2_400},
    ]
    figures = outage_figures(1_000, calls, events)
    assert figures["calls"] == 4 and figures["failed_calls"] == 4
    assert figures["attempts_spent"] == 1
    assert (figures["breaker_opened"], figures["breaker_closed"]) == (1, 1)
    assert (figures["first_opened_after_ms"], figures["closed_after_outage_ms"]) == (200, 400)
    assert figures["violations"] == []


def test_a_breaker_that_never_opens_in_an_outage_is_a_violation() -> None:
    started = [{"type": "outage.started", "at_ms": 0}]
    figures = outage_figures(10_000, [call(5, "a", 1, 503)], started)
    assert figures["violations"] == ["breaker_never_opened"]
    assert figures["closed_after_outage_ms"] is None
    assert outage_figures(10_000, [], [])["violations"] == ["outage_never_started"]


def test_an_outage_with_fewer_failed_calls_than_the_breaker_needs_does_not_judge_it() -> None:
    # Chaos killed the workers all through the outage: one call failed, the breaker needs five
    started = [{"type": "outage.started", "at_ms": 0}]
    figures = outage_figures(10_000, [call(5, "a", 1, 503)], started, min_calls=5)
    assert (figures["breaker_judged"], figures["violations"]) == (False, [])
    many = [call(t, f"m{t}", 1, 503) for t in range(5)]
    assert outage_figures(10_000, many, started, min_calls=5)["violations"] == [
        "breaker_never_opened"
    ]


def test_an_outage_that_saw_too_few_calls_goes_on_until_it_failed_enough_within_its_stretch() -> (
    None
):
    # Chaos stalled every call for the outage's planned second: it goes on past it until it has
    # failed three calls, then lets the next one through and says when it ended
    plan = FailurePlan(outage=(1_000, 2_000), outage_min_failures=3)
    schedule = FailureSchedule(plan)
    assert decide_status(schedule, Phase.RUN, "h", "a", 1_000) == 503
    assert decide_status(schedule, Phase.RUN, "h", "b", 2_500) == 503
    assert decide_status(schedule, Phase.RUN, "h", "c", 2_600) == 503
    assert schedule.outage_ended is None
    assert decide_status(schedule, Phase.RUN, "h", "d", 2_700) == 200
    assert schedule.outage_ended == 2_700
    assert decide_status(schedule, Phase.RUN, "h", "e", 2_800) == 200
    # ... but never past OUTAGE_STRETCH times its length
    capped = FailureSchedule(plan)
    assert decide_status(capped, Phase.RUN, "h", "a", 1_000) == 503
    assert decide_status(capped, Phase.RUN, "h", "b", 1_000 + 1_000 * OUTAGE_STRETCH) == 200
    # A receiver started again takes the outage up where it was
    resumed = FailureSchedule(plan)
    resumed.resume_outage(started=1_000, ended=None, failures=2)
    assert decide_status(resumed, Phase.RUN, "h", "c", 2_600) == 503
    assert decide_status(resumed, Phase.RUN, "h", "d", 2_700) == 200
    assert FailurePlan.from_json(plan.to_json()) == plan


def test_a_stretched_outage_is_judged_over_the_window_it_really_lasted() -> None:
    events = [
        {"type": "outage.started", "at_ms": 0},
        {"type": "outage.ended", "at_ms": 30_000},
        {"type": "endpoint.breaker_opened", "at_ms": 25_000},
    ]
    late = [call(t, f"m{t}", 1, 503) for t in range(20_000, 20_005)]
    figures = outage_figures(10_000, late, events, min_calls=5)
    assert figures["window_ms"] == [0, 30_000] and figures["failed_calls"] == 5
    assert (figures["breaker_opened"], figures["violations"]) == (1, [])


def test_a_breaker_that_opens_on_the_last_failures_just_after_the_outage_ended_opened_in_it() -> (
    None
):
    # Given an outage the receiver ended at the 20th failure, whose last answers reached their
    # worker's breaker 12 ms after the end was journalled (a short crash run on a loaded machine)
    failed = [call(t, f"m{t}", 1, 503) for t in range(0, 20_000, 1_000)]
    events = [
        {"type": "outage.started", "at_ms": 0},
        {"type": "outage.ended", "at_ms": 19_500},
        {"type": "endpoint.breaker_opened", "at_ms": 19_512},
    ]
    # Then the breaker counts as opened in the outage
    figures = outage_figures(12_000, failed, events, min_calls=10)
    assert (figures["breaker_opened"], figures["violations"]) == (1, [])
    # But not one that opened seconds later, on other failures
    late = [*events[:2], {"type": "endpoint.breaker_opened", "at_ms": 24_000}]
    assert outage_figures(12_000, failed, late, min_calls=10)["violations"] == [
        "breaker_never_opened"
    ]
