"""Running coroutines at once where the caller needs all of them or none."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable
from typing import TypeVar

T = TypeVar("T")


async def all_or_none(work: Iterable[Awaitable[T]]) -> list[T]:
    """Runs ``work`` at once and returns the results in order. When one fails (or the caller
    is cancelled), the others are cancelled and awaited before the first error is raised as
    itself: callers that tell errors apart by type (``asyncio.TaskGroup`` would wrap it in an
    ``ExceptionGroup``) keep working, and nothing goes on running behind the failure."""
    tasks = [asyncio.ensure_future(w) for w in work]
    try:
        return await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
