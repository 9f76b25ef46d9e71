"""Asks that arrive together are served by one call, each by a call that began after it."""

from __future__ import annotations

import asyncio
import threading

import pytest

from setu.batching import Batched, in_thread


class Calls:
    """A call that answers each key with its square, and holds while ``gate`` is clear."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.called = asyncio.Event()

    async def __call__(self, keys: list[int]) -> dict[int, int | BaseException]:
        self.batches.append(list(keys))
        self.called.set()
        await self.gate.wait()
        return {k: (ValueError(f"no {k}") if k < 0 else k * k) for k in keys}


async def test_asks_made_together_are_one_call_and_each_gets_its_own_answer() -> None:
    calls = Calls()
    batched: Batched[int, int] = Batched(calls)
    answers = await asyncio.gather(*(batched.ask(k) for k in [1, 2, 3, 2]))
    assert answers == [1, 4, 9, 4]
    assert calls.batches == [[1, 2, 3]]


async def test_an_ask_made_during_a_call_waits_for_the_next_call() -> None:
    calls = Calls()
    calls.gate.clear()
    batched: Batched[int, int] = Batched(calls)
    first = asyncio.ensure_future(batched.ask(2))
    await calls.called.wait()
    # Asked while the call for 2 is under way: its answer must come from a later call.
    second = asyncio.ensure_future(batched.ask(2))
    third = asyncio.ensure_future(batched.ask(5))
    await asyncio.sleep(0)
    calls.gate.set()
    assert await asyncio.gather(first, second, third) == [4, 4, 25]
    assert calls.batches == [[2], [2, 5]]


async def test_a_failed_key_fails_only_its_callers_and_a_failed_call_fails_its_batch() -> None:
    calls = Calls()
    batched: Batched[int, int] = Batched(calls)
    good, bad = await asyncio.gather(batched.ask(3), batched.ask(-1), return_exceptions=True)
    assert good == 9
    assert isinstance(bad, ValueError)

    async def broken(keys: list[int]) -> dict[int, int | BaseException]:
        raise ConnectionError("away")

    failing: Batched[int, int] = Batched(broken)
    with pytest.raises(ConnectionError):
        await failing.ask(1)
    # It serves the next asks (the batch's failure did not end it).
    failing._call = calls  # type: ignore[assignment]
    assert await failing.ask(4) == 16


async def test_most_limits_a_batch_and_the_rest_follow() -> None:
    calls = Calls()
    batched: Batched[int, int] = Batched(calls, most=2)
    assert await asyncio.gather(*(batched.ask(k) for k in range(5))) == [0, 1, 4, 9, 16]
    assert calls.batches == [[0, 1], [2, 3], [4]]


async def test_a_caller_that_stopped_waiting_leaves_the_others_served() -> None:
    calls = Calls()
    calls.gate.clear()
    batched: Batched[int, int] = Batched(calls)
    gone = asyncio.ensure_future(batched.ask(7))
    staying = asyncio.ensure_future(batched.ask(7))
    await asyncio.sleep(0)
    gone.cancel()
    calls.gate.set()
    assert await staying == 49
    assert gone.cancelled()


async def test_a_blocking_answer_in_a_thread_serves_the_asks_made_meanwhile_together() -> None:
    # Given a blocking answer (a Kafka or database read) that waits until let go
    calls: list[list[int]] = []
    go = threading.Event()
    called = asyncio.Event()
    loop = asyncio.get_running_loop()

    def answer(keys: list[int]) -> dict[int, str]:
        calls.append(sorted(keys))
        loop.call_soon_threadsafe(called.set)
        go.wait(5)
        return {k: f"v{k}" for k in keys}

    batched: Batched[int, str] = Batched(in_thread(answer))
    # When one ask starts a call and five more (one twice) come while it blocks
    first = asyncio.ensure_future(batched.ask(1))
    await called.wait()
    more = [asyncio.ensure_future(batched.ask(k)) for k in (2, 3, 3, 4, 5)]
    await asyncio.sleep(0)
    go.set()
    # Then each gets its own answer, in two calls: the first alone, the rest together
    assert await first == "v1"
    assert [await m for m in more] == ["v2", "v3", "v3", "v4", "v5"]
    assert calls == [[1], [2, 3, 4, 5]]
