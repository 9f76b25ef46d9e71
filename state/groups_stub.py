"""An in-memory :class:`~state.groups.GroupStore` with the same contract as the Redis one.

For unit tests and simulations of delivery; the contract tests run against both.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from setu.clock import now_ms
from setu.ordering.fencing import add_fence
from setu.ordering.groups import Standing
from setu.ordering.groups import standing as standing_of
from setu.ordering.state import (
    Fenced,
    GroupState,
    PartitionSnapshot,
    ReleaseRequests,
    StaleGroupState,
    StateWrite,
)
from state.groups import COUNTERS, UnhealthyGroup, UnhealthyPage


@dataclass(slots=True)
class _Partition:
    failed: set[str] = field(default_factory=set)
    outcomes: set[tuple[int, int]] = field(default_factory=set)
    pending: set[int] = field(default_factory=set)
    requests: set[str] = field(default_factory=set)
    redelivered: set[int] = field(default_factory=set)
    seek_generation: int = 0
    epoch: int = 0
    fences: dict[int, dict[int, int]] = field(default_factory=dict)


class StubGroupStore:
    """Group state of one subscription, in dictionaries."""

    rebuilt_after_loss = 0

    def __init__(self, clock: Callable[[], int] = now_ms) -> None:
        self.clock = clock
        self.groups: dict[str, tuple[int, GroupState]] = {}  # group -> (partition, state)
        # group -> when it became unhealthy (ms)
        self.since: dict[str, int] = {}
        self.partitions: dict[int, _Partition] = {}
        self.totals: dict[str, int] = dict.fromkeys(COUNTERS, 0)

    def _p(self, partition: int) -> _Partition:
        return self.partitions.setdefault(partition, _Partition())

    async def claim(self, partition: int) -> int:
        part = self._p(partition)
        part.epoch += 1
        return part.epoch

    async def record_fences(
        self, partition: int, epoch: int, ends: Mapping[int, int], keep: int = 64
    ) -> None:
        add_fence(self._p(partition).fences, epoch, ends, keep)

    async def fences(self, partition: int) -> dict[int, dict[int, int]]:
        return {e: dict(f) for e, f in self._p(partition).fences.items()}

    async def never_owned(self, partition: int) -> bool:
        return False

    async def load(self, partition: int) -> PartitionSnapshot:
        part = self._p(partition)
        return PartitionSnapshot(
            states={g: self.groups[g][1] for g in part.failed},
            outcomes=set(part.outcomes),
            pending_releases=set(part.pending),
            release_requests=set(part.requests),
            seek_generation=part.seek_generation,
            fences={e: dict(f) for e, f in part.fences.items()},
        )

    def _check(self, epochs: Mapping[int, int] | None) -> None:
        fenced = [p for p, e in sorted((epochs or {}).items()) if self._p(p).epoch != e]
        if fenced:
            raise Fenced(fenced, f"FENCED {fenced}")

    async def apply_batch(
        self,
        delivered: Mapping[int, Sequence[tuple[int, int]]],
        writes: Sequence[StateWrite],
        epochs: Mapping[int, int] | None = None,
    ) -> None:
        self._check(epochs)
        for partition, entries in delivered.items():
            await self.record_delivered(partition, entries)
        for write in writes:
            await self.apply(write)

    async def apply(self, write: StateWrite, epoch: int | None = None) -> None:
        self._check(None if epoch is None else {write.partition: epoch})
        part = self._p(write.partition)
        group = write.group or ""
        if write.touches_group:
            stored = self.groups.get(group)
            version = stored[1].version if stored else 0
            if version != write.expected_version:
                raise StaleGroupState(
                    f"STALE stored version {version}, expected {write.expected_version}"
                )
            if write.state is None:
                self.groups.pop(group, None)
                self.since.pop(group, None)
                part.failed.discard(group)
            else:
                self.groups[group] = (write.partition, write.state)
                self.since.setdefault(group, self.clock())
                part.failed.add(group)
        part.outcomes.update(write.outcomes)
        self.totals["delivered_total"] += write.delivered
        self.totals["dead_lettered"] += write.dead_lettered
        self.totals["retried"] += write.retried
        part.redelivered.update(write.redelivered)
        part.pending.difference_update(write.releases_done)
        if write.release_request_done:
            part.requests.discard(group)

    async def record_delivered(self, partition: int, outcomes: Sequence[tuple[int, int]]) -> None:
        self._p(partition).outcomes.update(outcomes)
        self.totals["delivered_total"] += len(outcomes)

    async def trim(self, partition: int, committed: Mapping[int, int]) -> None:
        part = self._p(partition)
        part.outcomes = {
            (t, o) for t, o in part.outcomes if t not in committed or o >= committed[t]
        }

    async def clear_outcomes(self, partition: int, tier: int) -> None:
        part = self._p(partition)
        part.outcomes = {(t, o) for t, o in part.outcomes if t != tier}

    async def poll_releases(self, partition: int) -> ReleaseRequests:
        part = self._p(partition)
        return ReleaseRequests(set(part.requests), set(part.pending))

    async def request_release(
        self, partition: int, groups: Iterable[str], offsets: Iterable[int]
    ) -> None:
        part = self._p(partition)
        part.requests.update(groups)
        part.pending.update(offsets)

    async def group(self, group_id: str) -> GroupState | None:
        stored = self.groups.get(group_id)
        return None if stored is None else stored[1]

    async def states_of(self, group_ids: Iterable[str]) -> dict[str, GroupState]:
        return {g: self.groups[g][1] for g in set(group_ids) if g in self.groups}

    async def failed_count(self) -> int:
        return len(self.groups)

    async def failed_groups(self) -> list[str]:
        return sorted(self.groups)

    async def unhealthy(
        self, standing: Standing | None, limit: int, after: tuple[int, str] | None
    ) -> UnhealthyPage:
        entries = sorted(
            (since, g)
            for g, since in self.since.items()
            if (standing is None or standing_of(self.groups[g][1])[0] is standing)
            and (after is None or (since, g) > after)
        )
        page = entries[:limit]
        found = [UnhealthyGroup(g, since, self.groups[g][1]) for since, g in page]
        return UnhealthyPage(found, page[-1] if len(entries) > limit else None)

    async def oldest_unhealthy(self) -> dict[Standing, int]:
        out: dict[Standing, int] = {}
        for group, since in self.since.items():
            kind = standing_of(self.groups[group][1])[0]
            out[kind] = min(out.get(kind, since), since)
        return out

    async def clear(self) -> int:
        removed = len(self.groups) + len(self.partitions) + (1 if any(self.totals.values()) else 0)
        self.groups.clear()
        self.since.clear()
        self.partitions.clear()
        self.totals = dict.fromkeys(COUNTERS, 0)
        return removed

    async def counters(self) -> dict[str, int]:
        return dict(self.totals)

    async def redelivered(self, partition: int) -> set[int]:
        return set(self._p(partition).redelivered)

    async def trim_dead_letters(self, partition: int, log_start: int) -> None:
        part = self._p(partition)
        part.redelivered = {o for o in part.redelivered if o >= log_start}
        part.pending = {o for o in part.pending if o >= log_start}

    async def mark_seek_applied(self, partition: int, generation: int) -> None:
        self._p(partition).seek_generation = generation
