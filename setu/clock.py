"""Wall-clock milliseconds, in one place so tests can reason about time."""

from __future__ import annotations

import time


def now_ms() -> int:
    return time.time_ns() // 1_000_000
