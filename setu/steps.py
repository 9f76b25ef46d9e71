"""Timing a piece of work step by step, for the log (:class:`Steps`)."""

from __future__ import annotations

import logging
import time

# Work slower than this logs where its time went.
SLOW_S = 5.0


class Steps:
    """How long each step of some work took, logged when the whole passed ``SLOW_S`` (a
    take-over of a subscription's partitions: a new subscription's first delivery waits for
    it)."""

    def __init__(self, log: logging.Logger, queued_s: float = 0.0) -> None:
        self._log = log
        self._last = time.monotonic()
        self._start = self._last - queued_s
        self._taken = [("a slot", queued_s)] if queued_s else []

    def done(self, step: str) -> None:
        now = time.monotonic()
        self._taken.append((step, now - self._last))
        self._last = now

    def log_if_slow(self, what: str) -> None:
        total = self._last - self._start
        if total >= SLOW_S:
            spent = ", ".join(f"{step} {seconds:.1f} s" for step, seconds in self._taken)
            self._log.info("%s took %.1f s: %s", what, total, spent)
