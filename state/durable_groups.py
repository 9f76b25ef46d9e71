"""The group-state store that survives Redis forgetting: :class:`state.groups.RedisGroupStore`
behind a changelog in Kafka (:mod:`state.changelog`, docs/decisions/0007-group-state-changelog.md).

- Every change goes to the changelog first, acknowledged by every in-sync replica, then to
  Redis. So the changelog is never behind what any worker acted on.
- Every takeover (:meth:`DurableGroupStore.claim`) replays the partition's changelog and makes
  Redis hold exactly that, under a new owner epoch above any recorded one. A Redis that came
  back empty, older, or as a replica without its last writes is thereby repaired.
- While a worker owns a partition, Redis counts its writes since the claim; a write or the
  periodic check (:meth:`DurableGroupStore.verify`) that finds fewer, or an older epoch, raises
  :class:`StateLost`, and the runner takes its partitions over again, which rebuilds them.
- A subscription of the earlier layout has its own changelog: a claim copies it into the shared
  one first (state/shared_changelog.py). A partition whose changelog holds no owner record even
  then (a subscription delivered before changelogs existed) is seeded from what Redis holds,
  once.

Recorded 2xx outcomes stay in Redis only: losing them repeats deliveries (same ``webhook-id``),
never reorders one; records of failed groups are recognised by their groups' done marks.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping, Sequence

from setu.ordering.fencing import KEEP_FENCES, add_fence
from setu.ordering.groups import Standing
from setu.ordering.state import (
    GroupState,
    PartitionSnapshot,
    ReleaseRequests,
    StateLost,
    StateWrite,
)
from setu.steps import Steps
from state.changelog import (
    PENDING,
    ChangelogIO,
    ChangelogRecord,
    letter_record,
    owner_record,
    records_of,
    release_record,
    seed_records,
    seek_record,
)
from state.groups import RedisGroupStore, UnhealthyPage

log = logging.getLogger(__name__)


class DurableGroupStore:
    """:class:`state.groups.GroupStore` with a changelog; one instance per subscription and
    worker (it remembers, per partition it owns, its epoch and its writes since the claim)."""

    def __init__(self, redis: RedisGroupStore, log: ChangelogIO) -> None:
        self.redis = redis
        self._log = log
        self._epochs: dict[int, int] = {}
        self._writes: dict[int, int] = {}
        # What written() last gave, kept until a claim or a write changes it (None then).
        self._written: dict[int, tuple[int, int]] | None = None
        self._fences: dict[int, dict[int, dict[int, int]]] = {}
        # Rebuilds that found Redis without the partition's latest state (metrics).
        self.rebuilt_after_loss = 0

    # Ownership

    async def claim(self, partition: int) -> int:
        steps = Steps(log)
        replay = await self._log.replay(partition)
        # A subscription of the earlier layout has a changelog of its own: what it holds
        # (and anything a worker of an earlier version wrote there since) is copied first.
        if await self._log.copy_earlier(partition, replay.earlier_copied):
            replay = await self._log.replay(partition)
        steps.done("changelog read")
        held_epoch = await self.redis.owner_epoch(partition)
        epoch = max(held_epoch, replay.epoch) + 1
        records: list[ChangelogRecord] = []
        fences = replay.fences
        # A partition nobody claimed is seeded from what Redis holds (a subscription from
        # before the changelog), unless the API created the subscription (``born``): then
        # there is nothing from before, and a thousand new ones skip a load each.
        if not replay.started and not replay.born:
            snapshot = await self.redis.load(partition)
            redelivered = await self.redis.redelivered(partition)
            records += seed_records(
                snapshot.states,
                snapshot.release_requests,
                snapshot.pending_releases,
                redelivered,
                snapshot.seek_generation,
                epoch,
            )
            fences = snapshot.fences
        elif held_epoch < replay.epoch or partition not in await self.redis.loaded():
            self.rebuilt_after_loss += 1
        records += [replay.record_for(key, epoch) for key in sorted(replay.stale)]
        records.append(owner_record(epoch, fences))
        steps.done("Redis's figures")
        await self._log.append(partition, records)
        steps.done("changelog write")
        # Whatever the previous owner wrote before this claim counts too.
        replay = await self._log.replay(partition)
        steps.done("changelog read again")
        await self.redis.restore(
            partition,
            epoch,
            replay.states,
            replay.release_requests,
            replay.pending,
            replay.redelivered,
            replay.seek_generation,
            replay.fences,
        )
        self._epochs[partition] = epoch
        self._writes[partition] = 0
        self._written = None
        self._fences[partition] = {e: dict(f) for e, f in replay.fences.items()}
        steps.done("restore")
        steps.log_if_slow(f"{self.redis.label}: claim of partition {partition}")
        return epoch

    async def record_fences(
        self, partition: int, epoch: int, ends: Mapping[int, int], keep: int = KEEP_FENCES
    ) -> None:
        fences = self._fences.setdefault(partition, {})
        add_fence(fences, epoch, ends, keep)
        await self._log.append(partition, [owner_record(epoch, fences)])
        await self.redis.record_fences(partition, epoch, ends, keep)

    async def never_owned(self, partition: int) -> bool:
        """Whether the API created the subscription and no owner claimed ``partition`` since
        (``born`` in state/changelog.py): its consumer group holds no offsets there."""
        return (await self._log.replay(partition)).never_owned

    async def verify(self, partition: int) -> None:
        """Raises :class:`StateLost` when Redis no longer holds what this owner wrote."""
        if partition not in self._epochs:
            return
        # Taken before Redis is read: a write that completes meanwhile is counted by Redis
        # first and by this owner after, so a count taken later could run ahead of the read.
        made = self._writes[partition]
        self._check(partition, made, await self.redis.writes_since_claim(partition))

    def written(self) -> Mapping[int, tuple[int, int]]:
        """Per partition owned: (its epoch, the writes made since the claim), counted before a
        reading of Redis elsewhere (delivery/watch.py). The same mapping while nothing
        changed, a new one after a claim or a write (asked each second of every owner: a new
        one each time was a tenth of an idle worker's CPU at 1,000 subscriptions); never
        changed in place, so a caller may keep it to compare with the next."""
        if self._written is None:
            self._written = {p: (epoch, self._writes[p]) for p, epoch in self._epochs.items()}
        return self._written

    def check_held(self, partition: int, epoch: int, made: int, held: tuple[int, int]) -> None:
        """:meth:`verify` of a reading taken elsewhere: ``made`` writes under ``epoch`` were
        counted before Redis was read as ``held``. A partition claimed again since is left to
        the next reading."""
        if self._epochs.get(partition) == epoch:
            self._check(partition, made, held)

    def _check(self, partition: int, made: int, held: tuple[int, int]) -> None:
        epoch = self._epochs[partition]
        held_epoch, held_writes = held
        if held_epoch < epoch or (held_epoch == epoch and held_writes < made):
            raise StateLost(
                [partition],
                f"partition {partition}: Redis holds epoch {held_epoch} and {held_writes} "
                f"writes, this owner made epoch {epoch} and {made}",
            )

    # Writes

    async def apply(self, write: StateWrite, epoch: int | None = None) -> None:
        await self.apply_batch({}, [write], None if epoch is None else {write.partition: epoch})

    async def record_delivered(self, partition: int, outcomes: Sequence[tuple[int, int]]) -> None:
        await self.apply_batch({partition: outcomes}, [])

    async def apply_batch(
        self,
        delivered: Mapping[int, Sequence[tuple[int, int]]],
        writes: Sequence[StateWrite],
        epochs: Mapping[int, int] | None = None,
    ) -> None:
        if not writes and not any(delivered.values()):
            # Redis is given nothing (RedisGroupStore.apply_batch) and counts no write, so
            # neither does this owner: else the next check would take Redis for having lost one.
            return
        by_partition: dict[int, list[ChangelogRecord]] = {}
        for write in writes:
            epoch = (epochs or {}).get(write.partition, self._epochs.get(write.partition, 0))
            records = records_of(write, epoch)
            if records:
                by_partition.setdefault(write.partition, []).extend(records)
        # Each partition's records in order, the partitions side by side.
        await asyncio.gather(*(self._log.append(p, r) for p, r in sorted(by_partition.items())))
        seen = {p: self._writes[p] for p in (epochs or {}) if p in self._writes}
        await self.redis.apply_batch(delivered, writes, epochs, seen)
        for partition in seen:
            self._writes[partition] += 1
        if seen:
            self._written = None

    async def mark_seek_applied(self, partition: int, generation: int) -> None:
        epoch = self._epochs.get(partition, 0)
        await self._log.append(partition, [seek_record(generation, epoch)])
        await self.redis.mark_seek_applied(partition, generation)

    async def request_release(
        self, partition: int, groups: Iterable[str], offsets: Iterable[int]
    ) -> None:
        group_list, offset_list = sorted(set(groups)), sorted(set(offsets))
        records = [release_record(g, True, None) for g in group_list]
        records += [letter_record(o, PENDING, None) for o in offset_list]
        if records:
            await self._log.append(partition, records)
        await self.redis.request_release(partition, group_list, offset_list)

    async def trim_dead_letters(self, partition: int, log_start: int) -> None:
        if log_start > 0:
            done = await self.redis.redelivered(partition)
            snapshot = await self.redis.poll_releases(partition)
            gone = sorted(o for o in done | snapshot.letters if o < log_start)
            if gone:
                epoch = self._epochs.get(partition, 0)
                await self._log.append(partition, [letter_record(o, None, epoch) for o in gone])
        await self.redis.trim_dead_letters(partition, log_start)

    # Reads and housekeeping that need no changelog

    async def load(self, partition: int) -> PartitionSnapshot:
        """The partition as Redis holds it; on a partition this worker owns, only if the same
        read found everything this owner wrote (else :class:`StateLost`): a snapshot read
        from a Redis that forgot, or from another server than the rebuild wrote to, would show
        failed groups as healthy and let their later messages overtake them."""
        made = self._writes.get(partition, 0)
        snapshot = await self.redis.load(partition)
        if partition in self._epochs:
            self._check(partition, made, snapshot.owner)
        return snapshot

    async def fences(self, partition: int) -> dict[int, dict[int, int]]:
        return await self.redis.fences(partition)

    async def trim(self, partition: int, committed: Mapping[int, int]) -> None:
        await self.redis.trim(partition, committed)

    async def clear_outcomes(self, partition: int, tier: int) -> None:
        await self.redis.clear_outcomes(partition, tier)

    async def poll_releases(self, partition: int) -> ReleaseRequests:
        await self.verify(partition)
        return await self.redis.poll_releases(partition)

    async def group(self, group_id: str) -> GroupState | None:
        return await self.redis.group(group_id)

    async def states_of(self, group_ids: Iterable[str]) -> dict[str, GroupState]:
        return await self.redis.states_of(group_ids)

    async def failed_count(self) -> int:
        return await self.redis.failed_count()

    async def failed_groups(self) -> list[str]:
        return await self.redis.failed_groups()

    async def unhealthy(
        self, standing: Standing | None, limit: int, after: tuple[int, str] | None
    ) -> UnhealthyPage:
        return await self.redis.unhealthy(standing, limit, after)

    async def oldest_unhealthy(self) -> dict[Standing, int]:
        return await self.redis.oldest_unhealthy()

    async def clear(self) -> int:
        return await self.redis.clear()

    async def counters(self) -> dict[str, int]:
        return await self.redis.counters()

    async def redelivered(self, partition: int) -> set[int]:
        return await self.redis.redelivered(partition)
