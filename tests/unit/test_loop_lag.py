"""How late the event loop runs (setu/loop_lag.py)."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from setu.loop_lag import QUIET_S, LoopLag


def hold_the_loop(seconds: float) -> None:
    """A step that runs on the loop without giving it back."""
    time.sleep(seconds)


def test_a_blocked_loop_is_measured_and_said(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "setu.loop_lag")

    async def scenario() -> LoopLag:
        lag = LoopLag(every_s=0.05, late_s=0.2)
        stop = asyncio.Event()
        probe = asyncio.get_running_loop().create_task(lag.run(stop))
        await asyncio.sleep(0.01)
        hold_the_loop(0.4)
        # The probe is overdue now: it measures at the loop's next turns.
        for _ in range(500):
            if lag.worst_s > 0.0 and caplog.records:
                break
            await asyncio.sleep(0.01)
        stop.set()
        await probe
        return lag

    lag = asyncio.run(scenario())
    assert 0.3 <= lag.worst_s < 2.0
    assert "ran 0.3 s late" in caplog.text or "ran 0.4 s late" in caplog.text


def test_lateness_is_said_at_most_every_quiet_period_with_the_worst_since(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, "setu.loop_lag")
    lag = LoopLag(late_s=1.0)
    lag.observe(1.5, now=100.0)
    lag.observe(3.0, now=101.0)  # within the quiet period: kept for the next warning
    lag.observe(0.2, now=102.0)  # not late
    lag.observe(1.2, now=100.0 + QUIET_S)
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2
    assert "1.5 s late" in said[0]
    assert "3.0 s late" in said[1]
    assert lag.worst_s == 3.0


def test_a_loop_on_time_says_nothing(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "setu.loop_lag")

    async def scenario() -> LoopLag:
        lag = LoopLag(every_s=0.01, late_s=0.5)
        stop = asyncio.Event()
        probe = asyncio.get_running_loop().create_task(lag.run(stop))
        await asyncio.sleep(0.1)
        stop.set()
        await probe
        return lag

    lag = asyncio.run(scenario())
    assert lag.worst_s < 0.5
    assert not caplog.records
