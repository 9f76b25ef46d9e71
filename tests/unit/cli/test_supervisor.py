from __future__ import annotations

import pytest

from cli.processes import EXIT_NOT_AVAILABLE
from cli.supervisor import GiveUp, Restart, after_exit, next_streak, restart_delay


@pytest.mark.parametrize(
    ("streak", "ran_for_s", "expected"),
    [
        (0, 0.5, 1),  # first quick failure
        (3, 2.0, 4),  # another quick one
        (5, 61.0, 1),  # ran long enough to count as healthy: count afresh
    ],
)
def test_quick_failures_are_counted_in_a_row(streak: int, ran_for_s: float, expected: int) -> None:
    assert next_streak(streak, ran_for_s) == expected


@pytest.mark.parametrize(
    ("streak", "delay_s"), [(1, 1.0), (2, 2.0), (3, 4.0), (5, 16.0), (6, 30.0), (40, 30.0)]
)
def test_restart_backoff_doubles_up_to_a_cap(streak: int, delay_s: float) -> None:
    assert restart_delay(streak) == delay_s


@pytest.mark.parametrize(
    ("code", "streak", "decision"),
    [
        (1, 1, Restart(1.0)),
        (-9, 3, Restart(4.0)),  # killed: restart
        (0, 1, Restart(1.0)),  # a long-running process must not end by itself
        (EXIT_NOT_AVAILABLE, 1, GiveUp("its module is not installed yet")),
    ],
)
def test_what_happens_after_an_exit(code: int, streak: int, decision: Restart | GiveUp) -> None:
    assert after_exit(code, streak) == decision
