"""Doubles of what a :class:`delivery.runner.SubscriptionRunner` drives, for the runner's tests
in tests/unit and tests/integration: a partition's engine that records when it was told to read
on, and a copy writer for tests that make no copies."""

from __future__ import annotations

import asyncio
from typing import Any


class EngineStub:
    """A partition's engine: records each ``unblocked`` call and sets ``done`` at the first."""

    def __init__(self) -> None:
        self.unblocked_at: list[tuple[int, int]] = []
        self.done = asyncio.Event()

    def unblocked(self, tier: int, offset: int) -> None:
        self.unblocked_at.append((tier, offset))
        self.done.set()


class NoCopies:
    """The runner's copy writer, in tests that make no copies."""

    async def send(self, topic: str, partition: int, records: Any) -> list[int]:
        raise AssertionError("this test makes no copies")
