"""Held heads read back in batches (delivery/scheduling.py): asks that come while a read is under
way wait for the next one, which answers them all."""

from __future__ import annotations

import asyncio
import threading

import pytest

from delivery.scheduling import Batches


async def test_asks_during_a_batch_are_answered_by_the_next_one_together() -> None:
    # Given an answer that blocks until let go, and records which keys each call got
    calls: list[list[int]] = []
    go = threading.Event()

    def answer(keys: list[int]) -> dict[int, str]:
        calls.append(sorted(keys))
        go.wait(5)
        return {k: f"v{k}" for k in keys}

    batches = Batches[int, str](answer)
    # When one ask starts a batch and five more (one twice) come while it runs
    first = asyncio.ensure_future(batches.ask(1))
    await asyncio.sleep(0.05)
    more = [asyncio.ensure_future(batches.ask(k)) for k in (2, 3, 3, 4, 5)]
    await asyncio.sleep(0.05)
    go.set()
    # Then each gets its own answer, in two calls: the first alone, the rest together
    assert await first == "v1"
    assert [await m for m in more] == ["v2", "v3", "v3", "v4", "v5"]
    assert calls == [[1], [2, 3, 4, 5]]


async def test_a_failed_batch_fails_each_of_its_asks_and_the_next_batch_goes_on() -> None:
    failing = True

    def answer(keys: list[int]) -> dict[int, int]:
        if failing:
            raise OSError("the broker is away")
        return {k: k for k in keys}

    batches = Batches[int, int](answer)
    with pytest.raises(OSError):
        await batches.ask(1)
    failing = False
    assert await batches.ask(2) == 2
