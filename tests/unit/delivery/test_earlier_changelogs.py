"""Which subscriptions still have a changelog of their own (delivery/changelog.py): a worker
starting a thousand runners asks Kafka once or twice, not a thousand times, and asks again
for a subscription deleted and made again under its name."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from typing import Any, cast

from delivery.changelog import EarlierChangelogs
from state.kafka_reader import KafkaReader


class Reader:
    """The part of a reader that answers which topics exist; counts its requests."""

    def __init__(self, found: set[str]) -> None:
        self.found = found
        self.asked: list[list[str]] = []
        self.gate = threading.Event()
        self.gate.set()

    def existing(self, topics: Sequence[str], timeout_s: float = 10.0) -> set[str]:
        self.asked.append(list(topics))
        self.gate.wait(10)
        return {t for t in topics if t in self.found}


def earlier(reader: Reader) -> EarlierChangelogs:
    return EarlierChangelogs(cast(KafkaReader, cast(Any, reader)))


async def test_runners_that_ask_together_are_answered_by_one_or_two_requests() -> None:
    # Given a request under way when a thousand runners ask
    reader = Reader({"old-7", "old-9"})
    reader.gate.clear()
    known = earlier(reader)
    first = asyncio.ensure_future(known.has("old-0"))
    await asyncio.sleep(0.05)
    rest = [asyncio.ensure_future(known.has(f"old-{n}")) for n in range(1, 1000)]
    await asyncio.sleep(0)
    reader.gate.set()
    answers = await asyncio.gather(first, *rest)
    # Then two requests answered them all, each right
    assert len(reader.asked) == 2
    assert [n for n, has in enumerate(answers) if has] == [7, 9]
    # And an answer is kept
    assert await known.has("old-7")
    assert len(reader.asked) == 2


async def test_an_answer_is_asked_again_once_the_subscription_no_longer_runs() -> None:
    reader = Reader({"old-1"})
    known = earlier(reader)
    assert await known.has("old-1")
    # When it is deleted with its own changelog, and made again under its name
    reader.found.clear()
    known.keep_only(set())
    # Then the worker does not take the old answer for the new one
    assert not await known.has("old-1")
