"""The group-state changelogs on Kafka as a delivery worker uses them (:mod:`state.changelog`,
:mod:`state.shared_changelog`): each subscription writes its topic's shared changelog with the
worker's producer; the worker reads each partition once for all of them with its reader. The
runner makes the topic before its first use when it is missing (a topic created by an older
version: ``prepare`` in delivery/worker.py).

A subscription of the earlier layout has a changelog of its own,
``setu.{project}.{subscription}.state``: its first claim of each partition copies it over, and
every write goes there too, marked mirrored, for workers of the earlier version while an
upgrade rolls out (state/shared_changelog.py).
Whether it has one is asked for many subscriptions in one request (:class:`EarlierChangelogs`):
a worker starting a thousand runners asks once or twice, not a thousand times.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Sequence

from delivery.kafka_io import AsyncProducer
from setu import names
from setu.batching import Batched
from setu.model import Subscription
from state.changelog import H_MIRRORED, ChangelogRecord, Entry
from state.kafka_reader import KafkaReader
from state.shared_changelog import (
    SharedChangelogs,
    SubscriptionChangelog,
    read_from,
)


def shared_changelogs(reader: KafkaReader) -> SharedChangelogs:
    """A worker's reading of the shared changelogs, through its reader's batched reads."""
    return SharedChangelogs(read_from(reader.tails_together))


class EarlierChangelogs:
    """Which subscriptions have a changelog of their own (the earlier layout), asked in one
    request for every runner that asks meanwhile; on one event loop. An answer is kept for
    the worker's life: nothing of this version makes such a changelog."""

    def __init__(self, reader: KafkaReader) -> None:
        self._reader = reader
        self._known: dict[str, bool] = {}
        self._asks: Batched[str, bool] = Batched(self._existing)

    async def has(self, topic: str) -> bool:
        known = self._known.get(topic)
        if known is not None:
            return known
        return await self._asks.ask(topic)

    async def _existing(self, topics: list[str]) -> dict[str, bool | BaseException]:
        found = await asyncio.to_thread(self._reader.existing, topics)
        for topic in topics:
            self._known[topic] = topic in found
        return {topic: topic in found for topic in topics}

    def keep_only(self, topics: Collection[str]) -> None:
        """Forgets the answers for topics not in ``topics``: a subscription deleted (its own
        changelog with it) and made again under its name is asked again."""
        for topic in [t for t in self._known if t not in topics]:
            del self._known[topic]

    async def read(self, topic: str, partition: int, start: int) -> tuple[list[Entry], int] | None:
        """The records of ``topic``'s ``partition`` from ``start`` to its end, and that end;
        None when the topic does not exist."""
        if not await self.has(topic):
            return None
        entries, _, end = await read_from(self._reader.tails_together)(topic, partition, start)
        return entries, end


class OwnChangelog:
    """:class:`state.shared_changelog.EarlierLog` of one subscription on Kafka."""

    def __init__(self, topic: str, earlier: EarlierChangelogs, producer: AsyncProducer) -> None:
        self.topic = topic
        self._earlier = earlier
        self._producer = producer

    async def read(self, partition: int, start: int) -> tuple[list[Entry], int] | None:
        return await self._earlier.read(self.topic, partition, start)

    async def mirror(self, partition: int, records: Sequence[ChangelogRecord]) -> None:
        if not await self._earlier.has(self.topic):
            return
        mark = (H_MIRRORED, b"1")
        await self._producer.send(
            self.topic, partition, [(r.key, r.value, [*r.headers(), mark]) for r in records]
        )


def subscription_changelog(
    sub: Subscription,
    producer: AsyncProducer,
    shared: SharedChangelogs,
    earlier: EarlierChangelogs,
) -> SubscriptionChangelog:
    return SubscriptionChangelog(
        names.groups_topic(sub.project, sub.topic),
        sub.name,
        producer.send,
        shared,
        OwnChangelog(names.state_topic(sub.project, sub.name), earlier, producer),
    )


def keep_only(
    subs: Sequence[Subscription], shared: SharedChangelogs, earlier: EarlierChangelogs
) -> None:
    """Keeps what was read of changelogs, and learned of subscriptions' own, only for the
    subscriptions a worker runs (``subs``)."""
    shared.keep_only({names.groups_topic(sub.project, sub.topic) for sub in subs})
    earlier.keep_only({names.state_topic(sub.project, sub.name) for sub in subs})
