"""A stand-in for the delivery runner's consumer thread (:class:`delivery.parts.ConsumerPort`):
commands run on the given Kafka consumer (or a double of one) at once, or wait in a queue, as
they wait on the real thread between two polls, until :meth:`ConsumerStub.run_queued`."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from confluent_kafka import KafkaException

T = TypeVar("T")


class ConsumerStub:
    def __init__(self, kafka: Any, *, queue: bool = False) -> None:
        self.kafka = kafka
        self.queue = queue
        self.queued: list[tuple[Callable[[Any], Any], Callable[[], None] | None]] = []
        self.flowing = threading.Event()
        self.flowing.set()
        self.topics: list[str] = []
        self._done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def factory(self, config: Any, loop: Any, listener: Any) -> ConsumerStub:
        """As :class:`delivery.parts.RunnerParts` builds a consumer: this one."""
        return self

    @property
    def done(self) -> asyncio.Future[None]:
        return self._done

    @property
    def running(self) -> bool:
        return not self._done.done()

    def start(self, topics: Sequence[str]) -> None:
        self.topics = list(topics)

    def post(self, command: Callable[[Any], Any], then: Callable[[], None] | None = None) -> None:
        if self.queue:
            self.queued.append((command, then))
            return
        self._run(command, then)

    def run_queued(self) -> None:
        queued, self.queued = self.queued, []
        for command, then in queued:
            self._run(command, then)

    def _run(self, command: Callable[[Any], Any], then: Callable[[], None] | None) -> None:
        # As the consumer thread does: a failed command is only logged, then ``then`` runs
        # on the loop.
        with contextlib.suppress(KafkaException):
            command(self.kafka)
        if then is not None:
            asyncio.get_running_loop().call_soon(then)

    async def call(self, command: Callable[[Any], T]) -> T:
        return command(self.kafka)

    async def close(self) -> None:
        if not self._done.done():
            self._done.set_result(None)
