"""A subscription's own retry tiers and DLQ, made at its first copy there
(docs/decisions/0014-no-topics-until-a-failure.md).

A subscription whose endpoint never failed has no retry tier or DLQ in Kafka. Its runner
learns which are missing when it starts (``prepare``), and again before each takeover (another
worker may have made them meanwhile, and copied messages there). Until one exists it counts
as empty everywhere: a takeover reads no tail of it and leaves it dormant (delivery/views.py),
nothing is committed for it. The first copy to any of them makes them all first, then writes;
a copy of a worker that lost the partition meanwhile is fenced as any copy is (decision 0004).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection, Sequence

from delivery.parts import CopyWriter
from setu.envelope import KafkaHeaders
from setu.errors import DependencyUnavailable

log = logging.getLogger(__name__)

# Making the topics again after Kafka was too slow: after this long, doubling up to the max.
MAKE_RETRY_S = 1.0
MAKE_RETRY_MAX_S = 30.0


class OwnTopics:
    """Which of the subscription's tiers and DLQ do not exist, as this runner last learnt."""

    def __init__(
        self,
        look: Callable[[], Awaitable[Collection[str] | None]] | None = None,
        make: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        """``look`` answers which are missing (None: none); ``make`` makes them all."""
        self._look = look
        self._make = make
        self.missing: set[str] = set()
        self._looked = False
        self._making = asyncio.Lock()

    def present(self, topic: str) -> bool:
        return topic not in self.missing

    async def look(self) -> None:
        """Asks which are missing. Once one was seen or made it exists for this runner: a
        broker whose metadata lags behind would otherwise make a tier holding messages look
        empty."""
        if self._look is None or (self._looked and not self.missing):
            return
        found = set(await self._look() or ())
        self.missing = self.missing & found if self._looked else found
        self._looked = True

    async def make(self) -> None:
        """Makes every missing one (the first copy to one of them, or a takeover that found
        the subscription's state waiting in one); returns once they exist. Kafka too slow
        to make them (many subscriptions failing at once make theirs at once) is asked again,
        for as long as it takes: the copy waiting here holds its group only, where failing
        the runner would start all its partitions over again."""
        async with self._making:
            if not self.missing:
                return
            if self._make is None:
                raise RuntimeError(f"cannot make the Kafka topics {sorted(self.missing)}")
            delay = MAKE_RETRY_S
            while True:
                try:
                    await self._make()
                    break
                except DependencyUnavailable as exc:
                    log.warning(
                        "making Kafka topics %s: %s; asking again in %.0f s",
                        sorted(self.missing)[:3],
                        exc,
                        delay,
                    )
                await asyncio.sleep(delay)
                delay = min(2 * delay, MAKE_RETRY_MAX_S)
            self.missing.clear()
            self._looked = True


class MadeAtFirstCopy:
    """A :class:`CopyWriter` that makes the subscription's tiers and DLQ before its first copy
    to one that does not exist yet."""

    def __init__(self, copies: CopyWriter, own: OwnTopics) -> None:
        self._copies = copies
        self._own = own

    async def send(
        self,
        topic: str,
        partition: int,
        records: Sequence[tuple[bytes, bytes | None, KafkaHeaders]],
    ) -> list[int]:
        if not self._own.present(topic):
            await self._own.make()
        return await self._copies.send(topic, partition, records)
