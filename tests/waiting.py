"""Awaiting a condition in tests: poll it until it holds, fail naming it when it never does."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

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


async def wait_for_async(
    what: str, condition: Callable[[], Awaitable[object]], timeout_s: float = 30.0
) -> None:
    """:func:`wait_for` for a condition that must be awaited (an HTTP call, say), polled
    without blocking the event loop."""
    deadline = time.monotonic() + timeout_s
    while not await condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s:.0f} s waiting for {what}")
        await asyncio.sleep(0.05)
