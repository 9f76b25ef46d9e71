"""Taking over one partition index of a subscription: everything that happens between Kafka
assigning it and the first record being read.

0. Claim the partition: bump its owner epoch, which fences the previous owner's writes (see
   :mod:`setu.ordering.fencing`); everything below is written under the new epoch.
1. Read the retry tiers' and the DLQ's tails (committed offset to end) and complete the state
   changes a crash cut short (:mod:`delivery.recovery`), so no source is copied twice. Where
   the tails ended becomes this epoch's fence; dead letters below the DLQ's first offset are
   forgotten.
2. Load the partition's group state, recorded outcomes and release requests.
3. Apply an operator's seek once per seek generation: the main log starts at the first offset
   at or after the requested time, and outcomes recorded for the old main offsets are dropped
   (the operator asked for those messages again).
4. Start the DLQ early enough to reach the dead letters of released groups and of single
   letters waiting to be delivered again.

A retry tier or DLQ that does not exist yet (made at the subscription's first copy there,
delivery/own_topics.py) has no tail: it ends at 0 and is idle. Group state that says messages
wait in one contradicts that (a broker whose metadata lags): :class:`TiersMissing` is raised
before anything is written, and the runner makes the topics and takes the partition over again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection
from dataclasses import dataclass, field

from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from delivery.recovery import missing_writes
from setu.model import Subscription
from setu.ordering.fencing import KEEP_FENCES, add_fence
from setu.ordering.groups import records_in
from setu.ordering.records import Record
from setu.ordering.state import PartitionSnapshot
from setu.ordering.tiers import DLQ, MAIN, is_retry
from setu.steps import Steps
from state.groups import GroupStore
from state.kafka_reader import KafkaReader, record_of

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Takeover:
    """What a worker needs to start on one partition index."""

    snapshot: PartitionSnapshot
    positions: dict[int, int]  # tier -> where its reading starts (known ones only)
    starts: dict[int, int] = field(default_factory=dict)  # tiers not starting at the commit
    seek_generation: int | None = None  # to record once the seek offset is committed
    epoch: int = 0  # this owner's epoch of the partition
    # Tiers with nothing to read from where their reading starts (their end reached): a
    # shared tiers reader need not fetch them until something is written there or sought
    # (docs/delivery.md, "What an idle subscription costs").
    idle: set[int] = field(default_factory=set)


class TiersMissing(Exception):
    """Group state says messages wait in tiers taken for missing (see the module doc)."""


def _waiting_in(snapshot: PartitionSnapshot, tiers: Collection[int]) -> set[int]:
    """Which of ``tiers`` the partition's group state says hold messages (a held head's record
    is in the main log: :func:`records_in`)."""
    out: set[int] = set()
    for state in snapshot.states.values():
        for t in tiers:
            if records_in(state, t) > 0:
                out.add(t)
        if DLQ in tiers and state.dlq_from >= 0:
            out.add(DLQ)
    if DLQ in tiers and snapshot.pending_releases:
        out.add(DLQ)
    return out


async def _fence(
    store: GroupStore,
    partition: int,
    epoch: int,
    ends: dict[int, int],
    snapshot: PartitionSnapshot,
    wrote: bool,
    dlq_low: int | None,
) -> PartitionSnapshot:
    """Records this epoch's fence (and forgets dead letters below the DLQ's first offset), and
    returns the partition's state as Redis now holds it. Read again only when recovery wrote
    or letters were trimmed: otherwise nothing was written since ``snapshot`` was read after
    the claim (with its owner epoch and write count) but the fence, and a release asked
    meanwhile is taken up at the engine's next poll. A thousand new subscriptions skip a
    load a partition so (docs/delivery.md, "Many subscriptions at once")."""
    await store.record_fences(partition, epoch, ends, KEEP_FENCES)
    if dlq_low is not None:
        await store.trim_dead_letters(partition, dlq_low)
    if wrote or dlq_low is not None:
        return await store.load(partition)
    add_fence(snapshot.fences, epoch, ends)
    return snapshot


async def take_over(
    sub: Subscription,
    partition: int,
    committed: dict[int, int | None],
    topics: dict[int, str],
    store: GroupStore,
    reader: KafkaReader,
    now_ms: int,
    missing: Collection[int] = (),
) -> Takeover:
    """Prepares ``partition`` of ``sub`` (see the module doc). ``committed`` maps each tier to
    its committed offset, None when the group never committed there; ``missing``: its tiers
    that do not exist in Kafka."""
    steps = Steps(log)
    epoch = await store.claim(partition)
    steps.done("claim")
    tail_tiers = [t for t in committed if (is_retry(t) or t == DLQ) and t not in missing]
    starts = []
    for tier in tail_tiers:
        offset = committed[tier]
        starts.append(
            TopicPartition(topics[tier], partition, OFFSET_BEGINNING if offset is None else offset)
        )
    tails = await reader.tails_together(starts)
    steps.done("tiers' tails")
    tail: list[Record] = []
    for tier in tail_tiers:
        for msg in tails.get((topics[tier], partition), []):
            try:
                tail.append(record_of(tier, msg))
            except ValueError:
                continue
    snapshot = await store.load(partition)
    steps.done("load")
    waiting = _waiting_in(snapshot, [t for t in committed if t in missing])
    if waiting:
        shown = ", ".join(topics[t] for t in sorted(waiting))
        raise TiersMissing(f"partition {partition}'s groups wait in {shown}, not found in Kafka")
    known = {t: o for t, o in committed.items() if o is not None}
    writes, _ = missing_writes(
        partition,
        snapshot.states,
        snapshot.outcomes,
        known,
        tail,
        now_ms,
        pending=set(snapshot.pending_releases),
        fences=snapshot.fences,
    )
    for write in writes:
        await store.apply(write, epoch)
    ends = {tier: tails.ends[(topics[tier], partition)] for tier in tail_tiers}
    ends.update((tier, 0) for tier in committed if tier in missing)
    dlq_low = tails.lows[(topics[DLQ], partition)] if DLQ in tail_tiers else None
    snapshot = await _fence(store, partition, epoch, ends, snapshot, bool(writes), dlq_low)
    steps.done("recovery and load")

    plan = Takeover(snapshot, dict(known), epoch=epoch)
    if sub.seek_to_ms is not None and sub.seek_generation > snapshot.seek_generation:
        offset = await asyncio.to_thread(
            reader.offset_for_time, topics[MAIN], partition, sub.seek_to_ms
        )
        await store.clear_outcomes(partition, MAIN)
        snapshot.outcomes = {(t, o) for t, o in snapshot.outcomes if t != MAIN}
        plan.starts[MAIN] = offset
        plan.positions[MAIN] = offset
        plan.seek_generation = sub.seek_generation

    revisit = [s.dlq_from for s in snapshot.states.values() if s.released and s.dlq_from >= 0]
    revisit.extend(snapshot.pending_releases)
    dlq_committed = committed.get(DLQ)
    if revisit and dlq_committed is not None and min(revisit) < dlq_committed:
        plan.starts[DLQ] = min(revisit)
        plan.positions[DLQ] = min(revisit)
    for tier in tail_tiers:
        key = (topics[tier], partition)
        begin = plan.starts.get(tier, committed[tier])
        low = tails.lows.get(key, 0)
        reading_from = low if begin is None else max(begin, low)
        if key in tails.ends and reading_from >= tails.ends[key]:
            plan.idle.add(tier)
    plan.idle.update(tier for tier in committed if tier in missing)
    steps.done("seek and starts")
    steps.log_if_slow(f"subscription {sub.project}/{sub.name}: partition {partition}")
    return plan
