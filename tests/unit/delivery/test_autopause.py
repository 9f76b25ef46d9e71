"""When a subscription pauses itself (delivery/autopause.py)."""

from __future__ import annotations

from api.operations import breaker_status
from delivery.autopause import AutoPause
from delivery.breaker import BreakerState, BreakerView
from setu.policies import DeadLetterWindow, Policies

CLOSED = BreakerView(BreakerState.CLOSED, 0, None, None, 0, 0, 0)


def outage(since_ms: int) -> BreakerView:
    return BreakerView(BreakerState.OPEN, since_ms, "HTTP 503", since_ms, 1, 0, 0)


def test_an_outage_longer_than_auto_pause_after_s_pauses() -> None:
    watch = AutoPause(Policies(auto_pause_after_s=60))
    assert watch.reason(CLOSED, 10**9) is None
    assert watch.reason(outage(1_000), 60_999) is None
    reason = watch.reason(outage(1_000), 61_000)
    assert reason == "endpoint broken for 60 s (auto_pause_after_s 60); last error: HTTP 503"
    assert AutoPause(Policies(auto_pause_after_s=None)).reason(outage(0), 10**12) is None


def test_more_than_threshold_of_the_last_size_dead_lettered_pauses() -> None:
    watch = AutoPause(Policies(dead_letter_window=DeadLetterWindow(size=5, threshold=2)))
    for dead in (True, False, True, False, False):
        watch.finished(dead)
    assert watch.reason(CLOSED, 0) is None  # 2 of 5: not more than 2
    watch.finished(False)  # the oldest dead letter leaves the window: 1 of 5
    watch.finished(True)
    watch.finished(True)
    assert watch.reason(CLOSED, 0) is None  # the window is F F F T T: 2 of 5
    watch.finished(True)  # F F T T T
    reason = watch.reason(CLOSED, 0)
    assert reason == (
        "dead_letter_window: 3 of the last 5 messages dead-lettered (more than 2 of 5)"
    )
    # A resumed subscription starts a new window
    watch.reset()
    assert watch.reason(CLOSED, 0) is None


def test_the_window_counts_from_the_first_message_and_a_new_window_starts_afresh() -> None:
    watch = AutoPause(Policies(dead_letter_window=DeadLetterWindow(size=100, threshold=2)))
    for _ in range(3):
        watch.finished(True)
    assert watch.reason(CLOSED, 0) is not None  # 3 of 3 is more than 2 of the last 100
    watch.update(Policies(dead_letter_window=DeadLetterWindow(size=100, threshold=5)))
    assert watch.reason(CLOSED, 0) is None
    watch.update(Policies(dead_letter_window=None))
    for _ in range(10):
        watch.finished(True)
    assert watch.reason(CLOSED, 0) is None


def test_status_shows_the_worst_breaker_the_workers_report() -> None:
    assert breaker_status([]) == {"state": "closed", "since_ms": None, "last_error": None}
    reports = [
        {"state": "closed", "since_ms": 5, "last_error": None},
        {"state": "open", "since_ms": 30, "last_error": "HTTP 502"},
        {"state": "open", "since_ms": 20, "last_error": "timeout"},
        {"state": "half_open", "since_ms": 40, "last_error": "HTTP 503"},
        None,
    ]
    assert breaker_status(reports) == {"state": "open", "since_ms": 20, "last_error": "timeout"}
