"""The worker's pace of commits (delivery/pace.py): a burst goes at once, the rest at the
rate, in the order they asked, and a commit cancelled while waiting gives its place up."""

from __future__ import annotations

import asyncio

import pytest

from delivery.pace import CommitPace


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def started(pace: CommitPace, count: int) -> tuple[list[int], list[asyncio.Task[None]]]:
    """``count`` commits asking for their turn, in order; the list of those let go."""
    let_go: list[int] = []

    async def commit(n: int) -> None:
        await pace.turn()
        let_go.append(n)

    tasks = [asyncio.create_task(commit(n)) for n in range(count)]
    for _ in range(3):
        await asyncio.sleep(0)
    return let_go, tasks


async def test_a_burst_starts_at_once_and_the_rest_wait_in_the_order_they_asked() -> None:
    # Given a pace of 8 commits a second after a burst of 3, on a clock that stands still
    clock = Clock()
    pace = CommitPace(per_s=8, burst=3, clock=clock)
    # When 7 commits ask for their turn
    let_go, tasks = await started(pace, 7)
    # Then the burst went at once and the others wait
    assert let_go == [0, 1, 2]
    assert pace.waiting == 4
    # And when 5/16 of a second passed (2.5 turns at 8 a second), the next two went, first
    # come first served
    clock.now += 0.3125
    pace._serve()
    await asyncio.sleep(0)
    assert let_go == [0, 1, 2, 3, 4]
    # And the half turn left over counts towards the next
    clock.now += 0.0625
    pace._serve()
    await asyncio.sleep(0)
    assert let_go == [0, 1, 2, 3, 4, 5]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_a_commit_asking_after_others_waits_behind_them_even_with_a_token_left() -> None:
    clock = Clock()
    pace = CommitPace(per_s=8, burst=1, clock=clock)
    let_go, tasks = await started(pace, 2)
    assert let_go == [0]
    # When half a turn came, nobody goes
    clock.now += 0.0625
    pace._serve()
    await asyncio.sleep(0)
    assert let_go == [0]
    # And when the other half came and a new commit asks before the timer fires
    clock.now += 0.0625
    late = asyncio.create_task(pace.turn())
    await asyncio.sleep(0)
    # Then the token is not the newcomer's: it waits behind the one that asked first
    assert not late.done()
    pace._serve()
    await asyncio.sleep(0)
    assert let_go == [0, 1]
    assert not late.done()
    late.cancel()
    await asyncio.gather(late, *tasks, return_exceptions=True)


async def test_a_commit_cancelled_while_waiting_gives_its_place_to_the_next() -> None:
    clock = Clock()
    pace = CommitPace(per_s=8, burst=1, clock=clock)
    let_go, tasks = await started(pace, 3)
    # When the first waiting commit is cancelled (its runner stopped)
    tasks[1].cancel()
    await asyncio.sleep(0)
    clock.now += 0.125
    pace._serve()
    await asyncio.sleep(0)
    # Then the turn went to the one behind it
    assert let_go == [0, 2]
    assert pace.waiting == 0
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_the_timer_lets_waiting_commits_go_on_its_own() -> None:
    # Given a real clock at 200 commits a second after a burst of 1
    pace = CommitPace(per_s=200, burst=1)
    let_go, tasks = await started(pace, 4)
    # Then the three behind the burst all start without anyone calling in
    await asyncio.wait_for(asyncio.gather(*tasks), timeout=5)
    assert let_go == [0, 1, 2, 3]


def test_a_pace_needs_a_rate_and_a_burst() -> None:
    with pytest.raises(ValueError):
        CommitPace(per_s=0)
    with pytest.raises(ValueError):
        CommitPace(burst=0)
