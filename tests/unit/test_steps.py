"""Timing work step by step for the log (setu/steps.py)."""

from __future__ import annotations

import logging

import pytest

from setu import steps
from setu.steps import Steps

log = logging.getLogger("tests.steps")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> Clock:
    """The steps' clock, moved by the test; the log captured."""
    fake = Clock()
    monkeypatch.setattr(steps.time, "monotonic", fake)
    caplog.set_level(logging.INFO, "tests.steps")
    return fake


def test_slow_work_logs_each_steps_share_and_a_slot_waited_for(
    clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    timed = Steps(log, queued_s=3.0)
    clock.now += 0.5
    timed.done("offsets")
    clock.now += 2.0
    timed.done("state")
    timed.log_if_slow("take-over of s")
    assert caplog.messages == [
        "take-over of s took 5.5 s: a slot 3.0 s, offsets 0.5 s, state 2.0 s"
    ]


def test_work_faster_than_the_threshold_logs_nothing(
    clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    timed = Steps(log)
    clock.now += steps.SLOW_S - 0.1
    timed.done("all of it")
    timed.log_if_slow("claim")
    assert caplog.messages == []
