"""The group-state changelog shared by the subscriptions of a topic
(docs/decisions/0014-no-topics-until-a-failure.md, part 1).

One compacted Kafka topic per Setu topic, ``setu.{project}.{topic}.groups``, made and deleted
with the topic, with its partition count: partition i holds what the owners of partition
index i of every subscription of the topic need. A record's key is the subscription's name, a
NUL byte, then the key :mod:`state.changelog` gives it (names cannot hold a NUL). What a claim
needs is unchanged (read to the end, write the owner record, read again to the end); what
changes is how often a worker reads.

A worker keeps, per changelog partition it has read, what the partition says for each
subscription (a :class:`PartitionReplay` each, fed record by record in log order, exactly as
a read from the beginning would feed it) and the offset it has read up to
(:class:`SharedChangelogs`). A claim asks for the partition's end as it is when the claim asks:
the records after what was read are read and fed, and every claim that asks while that read is
under way is served by the next one. So the claims of a thousand subscriptions of one
partition cost one read of what is new, not a thousand reads from the beginning; a takeover
after a worker died reads only what was written since this worker last read.

What is kept is dropped when the worker runs no subscription of the topic any more (a topic is
deleted only once it has no subscription: one made again with the same name starts a new
log), and read again from the beginning when the partition's end went below what was read or
its first offset above it (a log that is not the one that was read).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection, Sequence
from typing import Protocol

from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from state.changelog import (
    OWNER,
    ChangelogRecord,
    Entry,
    PartitionReplay,
    Send,
    cleared_record,
    earlier_record,
    entry_of,
)
from state.kafka_reader import Tails

log = logging.getLogger(__name__)

SEPARATOR = b"\0"

# (topic, partition, start) -> the records from ``start`` (0: the beginning) to the end as it
# was when reading began, the partition's first offset and that end.
ReadFrom = Callable[[str, int, int], Awaitable[tuple[list[Entry], int, int]]]


class EarlierLog(Protocol):
    """A subscription's own changelog of the earlier layout, where it has one."""

    async def read(self, partition: int, start: int) -> tuple[list[Entry], int] | None:
        """Its records of ``partition`` from ``start`` to its end, and that end; None when the
        subscription has none."""

    async def mirror(self, partition: int, records: Sequence[ChangelogRecord]) -> None:
        """Writes ``records``, marked mirrored, where the subscription has one; else nothing."""


def read_from(tails: Callable[[Sequence[TopicPartition]], Awaitable[Tails]]) -> ReadFrom:
    """:data:`ReadFrom` through a reader's ``tails`` (state/kafka_reader.py)."""

    async def read(topic: str, partition: int, start: int) -> tuple[list[Entry], int, int]:
        begin = TopicPartition(topic, partition, start if start > 0 else OFFSET_BEGINNING)
        got = await tails([begin])
        key = (topic, partition)
        return entries_in(got, topic, partition), got.lows.get(key, 0), got.ends[key]

    return read


def entries_in(tails: Tails, topic: str, partition: int) -> list[Entry]:
    """The changelog records ``tails`` read of ``topic``'s ``partition``."""
    entries = []
    for msg in tails.get((topic, partition), []):
        headers = msg.headers() or []
        pairs = headers.items() if isinstance(headers, dict) else headers
        entry = entry_of(msg.key(), msg.value(), pairs, msg.offset() or 0)
        if entry is not None:
            entries.append(entry)
    return entries


def shared_key(subscription: str, key: bytes) -> bytes:
    return subscription.encode() + SEPARATOR + key


def split_key(key: bytes) -> tuple[str, bytes] | None:
    """(subscription, its own key) of a shared changelog's record key; None for another."""
    subscription, separator, own = key.partition(SEPARATOR)
    if not separator or not subscription:
        return None
    return subscription.decode(errors="replace"), own


class _Partition:
    """One changelog partition as this worker has read it (see the module doc)."""

    def __init__(self, topic: str, partition: int, read: ReadFrom) -> None:
        self.topic, self.partition = topic, partition
        self._read = read
        self.end = 0
        self.replays: dict[str, PartitionReplay] = {}
        # Claims that asked after the read under way began: the next read serves them.
        self._next: asyncio.Future[None] | None = None
        self._task: asyncio.Task[None] | None = None

    async def caught_up(self) -> None:
        """Returns once a read that began after this call fed everything up to its end."""
        loop = asyncio.get_running_loop()
        if self._next is None:
            self._next = loop.create_future()
            # A read that failed for callers that stopped waiting is not an unseen error.
            self._next.add_done_callback(lambda f: f.cancelled() or f.exception())
        ready = self._next
        if self._task is None:
            self._task = loop.create_task(self._serve())
        await asyncio.shield(ready)

    async def _serve(self) -> None:
        try:
            while self._next is not None:
                ready, self._next = self._next, None
                try:
                    await self._catch_up()
                except Exception as exc:
                    ready.set_exception(exc)
                else:
                    ready.set_result(None)
        finally:
            self._task = None

    async def _catch_up(self) -> None:
        entries, low, end = await self._read(self.topic, self.partition, self.end)
        if end < self.end or low > self.end:
            log.warning(
                "%s [%d] is not the log read before (offsets %d..%d, read up to %d): "
                "read again from its beginning",
                self.topic,
                self.partition,
                low,
                end,
                self.end,
            )
            self.replays.clear()
            self.end = 0
            entries, low, end = await self._read(self.topic, self.partition, 0)
        for entry in entries:
            split = split_key(entry.key)
            if split is None:
                continue
            subscription, key = split
            replay = self.replays.get(subscription)
            if replay is None:
                replay = self.replays[subscription] = PartitionReplay()
            replay.feed(Entry(key, entry.value, entry.epoch, entry.offset))
        self.end = max(self.end, end)

    def replay_of(self, subscription: str) -> PartitionReplay:
        replay = self.replays.get(subscription)
        out = PartitionReplay() if replay is None else replay.copy()
        out.end = self.end
        return out


class SharedChangelogs:
    """What one worker has read of the shared changelogs (see the module doc); on one event
    loop."""

    def __init__(self, read: ReadFrom) -> None:
        self._read = read
        self._partitions: dict[tuple[str, int], _Partition] = {}

    async def replay(self, topic: str, partition: int, subscription: str) -> PartitionReplay:
        """What ``topic``'s ``partition`` says for ``subscription``, read up to its end as it
        was when this call began."""
        held = self._partitions.get((topic, partition))
        if held is None:
            held = self._partitions[(topic, partition)] = _Partition(topic, partition, self._read)
        await held.caught_up()
        return held.replay_of(subscription)

    def keep_only(self, topics: Collection[str]) -> None:
        """Forgets what was read of changelog topics not in ``topics``."""
        for key in [k for k in self._partitions if k[0] not in topics]:
            del self._partitions[key]

    def held(self) -> int:
        """How many partitions' replays are kept (metrics, tests)."""
        return len(self._partitions)


class SubscriptionChangelog:
    """:class:`state.changelog.ChangelogIO` of one subscription on its topic's shared
    changelog. ``shared`` None: written only (the API, which never claims)."""

    def __init__(
        self,
        topic: str,
        subscription: str,
        send: Send,
        shared: SharedChangelogs | None = None,
        earlier: EarlierLog | None = None,
    ) -> None:
        self.topic = topic
        self.subscription = subscription
        self._send = send
        self._shared = shared
        self._earlier = earlier

    async def append(self, partition: int, records: Sequence[ChangelogRecord]) -> None:
        shared = self._send(
            self.topic,
            partition,
            [(shared_key(self.subscription, r.key), r.value, r.headers()) for r in records],
        )
        if self._earlier is None:
            await shared
            return
        # A subscription of the earlier layout: a worker of the earlier version (an upgrade
        # rolling out) reads only its own changelog, and must find there what this one wrote.
        await asyncio.gather(shared, self._earlier.mirror(partition, records))

    async def replay(self, partition: int) -> PartitionReplay:
        if self._shared is None:
            raise RuntimeError("this changelog is written only")
        return await self._shared.replay(self.topic, partition, self.subscription)

    async def copy_earlier(self, partition: int, copied_to: int) -> bool:
        if self._earlier is None:
            return False
        found = await self._earlier.read(partition, copied_to)
        if found is None:
            return False
        entries, end = found
        if end <= copied_to:
            return False
        # What this version mirrored there is here already; the rest a worker of the earlier
        # version wrote (at first, everything; later, while an upgrade rolls out).
        records = [ChangelogRecord(e.key, e.value, e.epoch) for e in entries if not e.mirrored]
        await self._send(
            self.topic,
            partition,
            [
                (shared_key(self.subscription, r.key), r.value, r.headers())
                for r in [*records, earlier_record(end)]
            ],
        )
        if records:
            log.info(
                "%s [%d]: %d records of its own changelog (%s) copied to %s",
                self.subscription,
                partition,
                len(records),
                "from the start" if copied_to == 0 else "a worker of the earlier version wrote",
                self.topic,
            )
        return True


async def clear_subscription(
    topic: str,
    partitions: int,
    subscription: str,
    send: Send,
    read: ReadFrom,
) -> int:
    """What a deleted subscription leaves in its topic's shared changelog, removed: a tombstone
    for each of its keys that holds a value, then a ``cleared`` record, so that one of the same
    name created later starts empty whatever compaction has not removed yet. Returns how many
    keys were removed."""
    removed = 0
    for partition in range(partitions):
        entries, _, _ = await read(topic, partition, 0)
        live: dict[bytes, bool] = {}
        for entry in entries:
            split = split_key(entry.key)
            if split is not None and split[0] == subscription:
                live[split[1]] = entry.value is not None
        # The owner record stays: owner epochs keep rising for one of the same name.
        keys = [key for key, held in live.items() if held and key != OWNER]
        records = [ChangelogRecord(key, None, None) for key in keys] + [cleared_record()]
        await send(
            topic,
            partition,
            [(shared_key(subscription, r.key), r.value, r.headers()) for r in records],
        )
        removed += len(keys)
    return removed
