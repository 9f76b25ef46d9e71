"""Awaiting a condition in tests: poll it until it holds, fail naming it when it never does."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest


def wait_for(
    what: str, condition: Callable[[], object], timeout_s: float = 30.0, every_s: float = 0.05
) -> None:
    """Polls ``condition`` until it is truthy; fails the test naming ``what`` after
    ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(every_s)
