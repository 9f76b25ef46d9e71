"""Concurrent asks served together (docs/delivery.md, "Many subscriptions at once").

A worker that takes over a thousand subscriptions at once asks Kafka and Redis the same kind
of question a thousand times within a second: which topics exist, where a partition starts.
Asked one by one, each question costs a request, a thread and the broker's time. Here the
asks that arrive while a call is under way wait for the next call, which serves all of them:
one call per round trip, whatever the number of callers. Every answer was obtained by a
call that began after its caller asked, so a caller never gets an answer older than its
question.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable, Mapping
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

# ``call(keys)`` answers each key, with a value or the exception that key met; a key it
# leaves out, or an exception it raises, fails the callers of every key it was asked.
Call = Callable[[list[K]], Awaitable[Mapping[K, V | BaseException]]]


def in_thread(answer: Callable[[list[K]], Mapping[K, V]]) -> Call[K, V]:
    """A :data:`Call` of a blocking ``answer`` (Kafka's clients, the metadata store), run in
    a thread of the loop's pool."""

    async def call(keys: list[K]) -> Mapping[K, V | BaseException]:
        return await asyncio.to_thread(answer, keys)

    return call


class Batched(Generic[K, V]):
    """Asks for keys (see the module doc), on one event loop."""

    def __init__(self, call: Call[K, V], most: int = 0) -> None:
        """``most``: the largest batch (0: no limit); the rest wait for the next call."""
        self._call = call
        self._most = most
        self._waiting: dict[K, list[asyncio.Future[V]]] = {}
        self._task: asyncio.Task[None] | None = None

    async def ask(self, key: K) -> V:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[V] = loop.create_future()
        self._waiting.setdefault(key, []).append(future)
        if self._task is None:
            self._task = loop.create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        try:
            while self._waiting:
                keys = list(self._waiting)
                if self._most:
                    keys = keys[: self._most]
                batch = {k: self._waiting.pop(k) for k in keys}
                try:
                    answers = await self._call(keys)
                except Exception as exc:  # every caller of this batch sees it
                    answers = {k: exc for k in keys}
                for key, futures in batch.items():
                    answer = answers.get(key, LookupError(f"no answer for {key!r}"))
                    for future in futures:
                        if future.done():  # its caller stopped waiting
                            continue
                        if isinstance(answer, BaseException):
                            future.set_exception(answer)
                        else:
                            future.set_result(answer)
        finally:
            self._task = None
