"""Running coroutines at once, all or none (setu/together.py)."""

from __future__ import annotations

import asyncio

import pytest

from setu.together import all_or_none


class Refused(Exception):
    pass


def test_the_results_come_in_the_order_of_the_work_and_the_work_overlaps() -> None:
    async def scenario() -> tuple[list[int], list[str]]:
        seen: list[str] = []
        both_started = asyncio.Event()
        started = 0

        async def one(n: int, delay: float) -> int:
            nonlocal started
            started += 1
            if started == 2:
                both_started.set()
            # Each waits for the other to have started: run one after the other, they
            # would never end.
            await asyncio.wait_for(both_started.wait(), 5)
            await asyncio.sleep(delay)
            seen.append(f"end {n}")
            return n

        return await all_or_none([one(1, 0.02), one(2, 0.0)]), seen

    results, seen = asyncio.run(scenario())
    assert results == [1, 2]
    assert seen == ["end 2", "end 1"]


def test_a_failure_is_raised_as_itself_and_the_others_are_stopped_first() -> None:
    async def scenario() -> tuple[BaseException | None, bool, bool]:
        cancelled = False
        still_running = False
        hanging_started = asyncio.Event()

        async def hangs() -> int:
            nonlocal cancelled
            hanging_started.set()
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                cancelled = True
                raise
            return 0

        async def fails() -> int:
            await hanging_started.wait()
            raise Refused("no")

        error = None
        try:
            await all_or_none([hangs(), fails()])
        except Refused as exc:
            error = exc
        # Everything started is over by the time the error reaches the caller.
        still_running = any(
            not t.done() for t in asyncio.all_tasks() if t is not asyncio.current_task()
        )
        return error, cancelled, still_running

    error, cancelled, still_running = asyncio.run(scenario())
    assert isinstance(error, Refused)
    assert cancelled
    assert not still_running


def test_nothing_to_run_gives_nothing() -> None:
    assert asyncio.run(all_or_none([])) == []


def test_a_cancelled_caller_cancels_the_work() -> None:
    async def scenario() -> bool:
        cancelled = asyncio.Event()
        started = asyncio.Event()

        async def hangs() -> None:
            started.set()
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                cancelled.set()
                raise

        caller = asyncio.ensure_future(all_or_none([hangs()]))
        await started.wait()
        caller.cancel()
        with pytest.raises(asyncio.CancelledError):
            await caller
        return cancelled.is_set()

    assert asyncio.run(scenario())
