"""Keeping children running: restart with backoff, give up on the ones that cannot run.

The decisions (:func:`next_streak`, :func:`restart_delay`, :func:`after_exit`) are pure; the
:class:`Supervisor` applies them to real :class:`~cli.processes.Child` objects.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from cli.processes import EXIT_NOT_AVAILABLE, Child

# A run this long counts as healthy: the next failure starts the backoff afresh.
STABLE_AFTER_S = 60.0
FIRST_DELAY_S = 1.0
MAX_DELAY_S = 30.0


@dataclass(frozen=True)
class Restart:
    """Start the child again after ``delay_s``."""

    delay_s: float


@dataclass(frozen=True)
class GiveUp:
    """Leave the child stopped; ``reason`` says why."""

    reason: str


def next_streak(streak: int, ran_for_s: float, stable_after_s: float = STABLE_AFTER_S) -> int:
    """How many times in a row the child has failed quickly, counting the exit just seen."""
    return 1 if ran_for_s >= stable_after_s else streak + 1


def restart_delay(streak: int, first_s: float = FIRST_DELAY_S, max_s: float = MAX_DELAY_S) -> float:
    """Exponential backoff: ``first_s`` after one quick failure, doubling up to ``max_s``."""
    return min(max_s, first_s * 2.0 ** max(0, streak - 1))


def after_exit(exit_code: int, streak: int) -> Restart | GiveUp:
    """What to do about a child that exited with ``exit_code`` after ``streak`` quick failures."""
    if exit_code == EXIT_NOT_AVAILABLE:
        return GiveUp("its module is not installed yet")
    return Restart(restart_delay(streak))


@dataclass
class _Watch:
    child: Child
    streak: int = 0
    restart_at: float | None = None
    given_up: bool = False


@dataclass
class Supervisor:
    """Watches children; :meth:`poll` restarts the dead ones and reports what happened."""

    report: Callable[[str], None]
    _watches: list[_Watch] = field(default_factory=list)

    def watch(self, child: Child) -> None:
        self._watches.append(_Watch(child))

    def poll(self) -> None:
        """Handles every exit since the last poll and every restart that is now due."""
        now = time.monotonic()
        for watch in self._watches:
            if watch.given_up:
                continue
            if watch.restart_at is not None:
                if now >= watch.restart_at:
                    watch.restart_at = None
                    watch.child.start()
                continue
            code = watch.child.exit_code()
            if code is None:
                continue
            self._handle_exit(watch, code, now)

    def _handle_exit(self, watch: _Watch, code: int, now: float) -> None:
        child = watch.child
        watch.streak = next_streak(watch.streak, child.ran_for())
        decision = after_exit(code, watch.streak)
        log = child.spec.log_path
        if isinstance(decision, GiveUp):
            watch.given_up = True
            self.report(f"{child.spec.name} is not running: {decision.reason} (see {log})")
            return
        watch.restart_at = now + decision.delay_s
        self.report(
            f"{child.spec.name} exited with code {code}; restarting in {decision.delay_s:g}s "
            f"(see {log}):\n{_indent(child.log_tail())}"
        )


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.splitlines())
