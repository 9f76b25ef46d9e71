"""The group-state changelog shared by the subscriptions of a topic (state/shared_changelog.py):
each subscription sees exactly what a changelog of its own would say, a worker reads each
partition once for all of them, and a deleted subscription leaves nothing to one of the same
name."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from setu.ordering.state import EMPTY_COUNTS, GroupState
from state.changelog import (
    OWNER,
    ChangelogRecord,
    Entry,
    Keyed,
    PartitionReplay,
    group_record,
    owner_record,
    release_record,
)
from state.shared_changelog import (
    SharedChangelogs,
    SubscriptionChangelog,
    clear_subscription,
    shared_key,
)

TOPIC = "setu.p.orders.groups"
FAILED = GroupState(
    counts=(0, 2, *EMPTY_COUNTS[2:]), head="a-1", failed_at_ms=5, version=1, attempts=1
)


class Log:
    """A Kafka topic kept in lists, one per partition, that counts its reads."""

    def __init__(self) -> None:
        self.partitions: dict[int, list[Keyed]] = {}
        self.reads: list[tuple[int, int]] = []
        self.gate: asyncio.Event | None = None  # set: reads go on

    async def send(self, topic: str, partition: int, records: Sequence[Keyed]) -> None:
        assert topic == TOPIC
        self.partitions.setdefault(partition, []).extend(records)

    async def read(self, topic: str, partition: int, start: int) -> tuple[list[Entry], int, int]:
        assert topic == TOPIC
        self.reads.append((partition, start))
        held = list(self.partitions.get(partition, []))  # the end as reading began
        if self.gate is not None:
            await self.gate.wait()
        entries = []
        for offset, (key, value, headers) in enumerate(held):
            if offset >= start:
                epoch = next((int(v) for h, v in headers if h == "setu-epoch"), None)
                entries.append(Entry(key, value, epoch, offset))
        return entries, 0, len(held)


def own_replay(records: Sequence[ChangelogRecord]) -> PartitionReplay:
    """What a changelog of the subscription's own would say."""
    replay = PartitionReplay()
    for n, record in enumerate(records):
        replay.feed(Entry(record.key, record.value, record.epoch, n))
    return replay


def same(a: PartitionReplay, b: PartitionReplay) -> bool:
    fields = ("states", "epoch", "fences", "release_requests", "pending", "redelivered")
    more = ("seek_generation", "started", "stale")
    return all(getattr(a, f) == getattr(b, f) for f in fields + more)


RECORDS = st.one_of(
    st.builds(lambda e: owner_record(e, {e: {1: e * 10}}), st.integers(1, 6)),
    st.builds(
        lambda g, e, healed: group_record(g, None if healed else replace(FAILED, version=e), e),
        st.sampled_from(["g1", "g2", "g3"]),
        st.integers(1, 6),
        st.booleans(),
    ),
    st.builds(
        lambda g, on: release_record(g, on, None), st.sampled_from(["g1", "g2"]), st.booleans()
    ),
)


@settings(max_examples=200, deadline=None)
@given(
    history=st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), RECORDS), max_size=40),
    cuts=st.lists(st.integers(0, 40), max_size=4),
)
def test_each_subscription_sees_what_its_own_changelog_would_say(
    history: list[tuple[str, ChangelogRecord]], cuts: list[int]
) -> None:
    async def run() -> None:
        # Given three subscriptions whose records interleave in one shared partition, read
        # by a worker at random moments while they are written
        log = Log()
        shared = SharedChangelogs(log.read)
        views = {s: SubscriptionChangelog(TOPIC, s, log.send, shared) for s in "abc"}
        for n, (sub, record) in enumerate(history):
            if n in cuts:
                await views["a"].replay(0)
            await views[sub].append(0, [record])
        # Then each subscription's replay is exactly what its own changelog would say
        for sub in "abc":
            mine = [record for s, record in history if s == sub]
            assert same(await views[sub].replay(0), own_replay(mine))

    asyncio.run(run())


async def test_claims_of_many_subscriptions_share_one_read_then_read_only_what_is_new() -> None:
    # Given a partition holding an owner record of each of 100 subscriptions
    log = Log()
    shared = SharedChangelogs(log.read)
    views = [SubscriptionChangelog(TOPIC, f"s{n}", log.send, shared) for n in range(100)]
    for n, view in enumerate(views):
        await view.append(0, [owner_record(n + 1, {})])
    # When all 100 claim it at once while a read is under way
    log.gate = asyncio.Event()
    first = asyncio.ensure_future(views[0].replay(0))
    await asyncio.sleep(0)
    rest = [asyncio.ensure_future(view.replay(0)) for view in views[1:]]
    await asyncio.sleep(0)
    log.gate.set()
    replays = await asyncio.gather(first, *rest)
    # Then the one under way and one more served them all, each with its own epoch
    assert log.reads == [(0, 0), (0, 100)]
    assert [r.epoch for r in replays] == list(range(1, 101))
    # And a later claim reads from where the worker stopped, not from the beginning
    await views[7].append(0, [owner_record(200, {})])
    assert (await views[7].replay(0)).epoch == 200
    assert log.reads[-1] == (0, 100)


async def test_a_claim_sees_every_record_written_before_it_asked() -> None:
    # Given a read under way when a subscription's owner record is written
    log = Log()
    shared = SharedChangelogs(log.read)
    view = SubscriptionChangelog(TOPIC, "s", log.send, shared)
    log.gate = asyncio.Event()
    early = asyncio.ensure_future(view.replay(0))
    await asyncio.sleep(0)
    await view.append(0, [owner_record(3, {})])
    # When the claim asks after that write
    late = asyncio.ensure_future(view.replay(0))
    await asyncio.sleep(0)
    log.gate.set()
    # Then it is served by a read that began after it asked, and sees the record
    assert (await late).epoch == 3
    assert len(log.reads) == 2
    await early


async def test_a_replay_handed_out_is_the_callers_own() -> None:
    log = Log()
    shared = SharedChangelogs(log.read)
    view = SubscriptionChangelog(TOPIC, "s", log.send, shared)
    await view.append(0, [owner_record(1, {}), group_record("g", FAILED, 1)])
    mine = await view.replay(0)
    mine.states.clear()
    assert (await view.replay(0)).states == {"g": FAILED}


async def test_a_log_that_is_not_the_one_read_before_is_read_again_from_its_beginning() -> None:
    # Given a worker that read a partition of ten records
    log = Log()
    shared = SharedChangelogs(log.read)
    view = SubscriptionChangelog(TOPIC, "s", log.send, shared)
    await view.append(0, [owner_record(n, {}) for n in range(1, 11)])
    assert (await view.replay(0)).epoch == 10
    # When the log is replaced by a shorter one
    log.partitions[0] = []
    await view.append(0, [owner_record(2, {}), group_record("g", FAILED, 2)])
    # Then what it held before does not count
    replay = await view.replay(0)
    assert (replay.epoch, replay.states) == (2, {"g": FAILED})


async def test_a_deleted_subscription_leaves_nothing_to_one_of_the_same_name_but_its_epoch() -> (
    None
):
    # Given a subscription with a failed group and an operator's release request
    log = Log()
    shared = SharedChangelogs(log.read)
    view = SubscriptionChangelog(TOPIC, "s", log.send, shared)
    other = SubscriptionChangelog(TOPIC, "t", log.send, shared)
    await view.append(0, [owner_record(4, {4: {1: 9}}), group_record("g", FAILED, 4)])
    await view.append(0, [release_record("g", True, None)])
    await other.append(0, [owner_record(1, {}), group_record("h", FAILED, 1)])
    assert (await view.replay(0)).states == {"g": FAILED}
    # When it is deleted
    removed = await clear_subscription(TOPIC, 1, "s", log.send, log.read)
    # Then its keys are tombstoned but its owner record, so compaction removes them
    assert removed == 2
    tombstoned = {k for k, v, _ in log.partitions[0] if v is None}
    assert tombstoned == {shared_key("s", b"g:g"), shared_key("s", b"r:g")}
    assert shared_key("s", OWNER) not in tombstoned
    # And one of the same name starts empty, its owner epochs still above the last one
    again = await view.replay(0)
    assert (again.states, again.release_requests, again.started) == ({}, set(), False)
    assert again.fences == {}
    assert again.epoch == 4
    # And the other subscription of the topic keeps its state
    assert (await other.replay(0)).states == {"h": FAILED}


class OwnLog:
    """A subscription's own changelog of the earlier layout, in a list."""

    def __init__(self, records: Sequence[ChangelogRecord]) -> None:
        self.entries = [Entry(r.key, r.value, r.epoch, n) for n, r in enumerate(records)]

    def write(self, records: Sequence[ChangelogRecord], mirrored: bool = False) -> None:
        """As a worker of the earlier version writes (``mirrored``: as this one does)."""
        for r in records:
            self.entries.append(Entry(r.key, r.value, r.epoch, len(self.entries), mirrored))

    async def read(self, partition: int, start: int) -> tuple[list[Entry], int] | None:
        return self.entries[start:], len(self.entries)

    async def mirror(self, partition: int, records: Sequence[ChangelogRecord]) -> None:
        self.write(records, mirrored=True)


async def test_an_upgrade_copies_the_earlier_changelog_and_each_version_sees_the_other() -> None:
    # Given a subscription of the earlier layout, with a changelog of its own
    log = Log()
    own = OwnLog([owner_record(3, {}), group_record("g", FAILED, 3)])
    view = SubscriptionChangelog(TOPIC, "s", log.send, SharedChangelogs(log.read), own)
    # When a worker of this version first claims a partition
    assert await view.copy_earlier(0, (await view.replay(0)).earlier_copied)
    replay = await view.replay(0)
    # Then the shared changelog says what its own said, and where the copy ended
    assert (replay.epoch, replay.states, replay.earlier_copied) == (3, {"g": FAILED}, 2)
    assert not await view.copy_earlier(0, replay.earlier_copied)
    # When it writes (a claim, a group healed), a worker of the earlier version finds it in
    # the subscription's own changelog too
    await view.append(0, [owner_record(4, {}), group_record("g", None, 4)])
    assert [e.epoch for e in own.entries[-2:]] == [4, 4]
    assert own_replay_of(own.entries).states == {}
    # When a worker of the earlier version then claims and parks a group there
    own.write([owner_record(5, {}), group_record("h", FAILED, 5)])
    # Then the next claim of this version copies what that one wrote, and only that
    assert await view.copy_earlier(0, (await view.replay(0)).earlier_copied)
    replay = await view.replay(0)
    assert (replay.epoch, replay.states, replay.earlier_copied) == (5, {"h": FAILED}, 6)
    copied = [k for k, _, _ in log.partitions[0] if k.endswith(b"owner")]
    assert len(copied) == 3  # 3 copied, 4 written here, 5 copied: none twice


def own_replay_of(entries: Sequence[Entry]) -> PartitionReplay:
    replay = PartitionReplay()
    for entry in entries:
        replay.feed(entry)
    return replay


async def test_a_worker_forgets_what_it_read_of_topics_it_no_longer_runs() -> None:
    log = Log()
    shared = SharedChangelogs(log.read)
    await SubscriptionChangelog(TOPIC, "s", log.send, shared).replay(0)
    shared.keep_only({TOPIC})
    assert shared.held() == 1
    shared.keep_only(set())
    assert shared.held() == 0
