"""How late a process's event loop runs what is due: a loop that falls behind delays every
Redis answer, Kafka hand-over and webhook call of the process at once, and each of them then
looks slow on its own in the log. This says which it is."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

log = logging.getLogger(__name__)

# How often the loop is probed, and the lateness worth a warning.
EVERY_S = 0.5
LATE_S = 1.0
# Warnings at most this often (the worst lateness since the last one is said).
QUIET_S = 10.0


class LoopLag:
    """Sleeps ``every_s`` again and again and measures how much later than asked it woke.
    ``worst_s``: the worst lateness seen; a lateness over ``late_s`` is logged."""

    def __init__(self, every_s: float = EVERY_S, late_s: float = LATE_S) -> None:
        self.every_s = every_s
        self.late_s = late_s
        self.worst_s = 0.0
        self._unsaid_s = 0.0  # the worst lateness since the last warning
        self._said_at = float("-inf")

    def observe(self, late_s: float, now: float) -> None:
        self.worst_s = max(self.worst_s, late_s)
        if late_s < self.late_s:
            return
        self._unsaid_s = max(self._unsaid_s, late_s)
        if now - self._said_at >= QUIET_S:
            log.warning(
                "the event loop ran %.1f s late: everything this process waits on waited "
                "that much longer (a CPU-bound step, or the machine is full)",
                self._unsaid_s,
            )
            self._unsaid_s, self._said_at = 0.0, now

    async def run(self, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        while not stop.is_set():
            asked = loop.time()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.every_s)
            if stop.is_set():
                return
            self.observe(max(0.0, loop.time() - asked - self.every_s), time.monotonic())
