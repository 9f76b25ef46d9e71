"""Contract of the group-state store: the same tests on the in-memory stub and on real Redis."""

from __future__ import annotations

import uuid

import pytest
from redis.asyncio import Redis

from setu.ordering.groups import Standing
from setu.ordering.groups import standing as standing_of
from setu.ordering.state import (
    EMPTY_COUNTS,
    Fenced,
    GroupState,
    StaleGroupState,
    StateWrite,
)
from setu.ordering.tiers import DLQ
from state import keys
from state.groups import COUNTERS, GroupStore, RedisGroupStore
from state.groups_stub import StubGroupStore
from tests.integration.contracts import contract

pytestmark = pytest.mark.integration


store = contract(
    {
        "stub": lambda backing: StubGroupStore(),
        "redis": lambda backing: RedisGroupStore(backing.async_client(), backing.project("t"), "s"),
    }
)


def failed(tier: int, n: int = 1, head: str | None = "a", version: int = 1) -> GroupState:
    counts = list(EMPTY_COUNTS)
    counts[tier] = n
    return GroupState(counts=tuple(counts), head=head, version=version, failed_at_ms=7)


async def test_a_failed_group_round_trips_and_is_counted(store: GroupStore) -> None:
    # Given a group written as failed on partition 2
    state = failed(1, 3)
    await store.apply(StateWrite(2, "g", touches_group=True, expected_version=0, state=state))
    # Then it reads back equal, is counted, and loads with its partition only
    assert await store.group("g") == state
    assert await store.failed_count() == 1
    assert (await store.load(2)).states == {"g": state}
    assert (await store.load(1)).states == {}


async def test_failed_groups_are_listed_and_a_cleared_store_holds_nothing(
    store: GroupStore,
) -> None:
    # Given two failed groups on two partitions, one delivered outcome and a counter
    for partition, group in ((1, "b"), (2, "a")):
        write = StateWrite(partition, group, touches_group=True, state=failed(1), retried=1)
        await store.apply(write)
    await store.record_delivered(1, [(0, 5)])
    # Then they are listed by id
    assert await store.failed_groups() == ["a", "b"]
    # And once cleared (the subscription is deleted), nothing of them is left
    assert await store.clear() > 0
    assert await store.failed_groups() == []
    assert await store.counters() == dict.fromkeys(COUNTERS, 0)
    assert (await store.load(1)).outcomes == set()


async def test_a_group_becoming_healthy_leaves_no_state(store: GroupStore) -> None:
    await store.apply(StateWrite(0, "g", touches_group=True, expected_version=0, state=failed(1)))
    await store.apply(StateWrite(0, "g", touches_group=True, expected_version=1, state=None))
    assert await store.group("g") is None
    assert await store.failed_count() == 0
    assert (await store.load(0)).states == {}


async def test_a_write_with_a_stale_version_changes_nothing(store: GroupStore) -> None:
    # Given a group at version 1
    await store.apply(StateWrite(0, "g", touches_group=True, expected_version=0, state=failed(1)))
    # When a writer that expects version 0 writes again, with outcomes and counters
    with pytest.raises(StaleGroupState):
        await store.apply(
            StateWrite(
                0,
                "g",
                touches_group=True,
                expected_version=0,
                state=failed(2, version=2),
                outcomes=((0, 5),),
                retried=1,
            )
        )
    # Then the state, the outcomes and the counters are as before
    assert await store.group("g") == failed(1)
    assert (await store.load(0)).outcomes == set()
    assert (await store.counters())["retried"] == 0


async def test_outcomes_and_counters_change_with_the_state(store: GroupStore) -> None:
    await store.apply(
        StateWrite(
            3,
            "g",
            touches_group=True,
            expected_version=0,
            state=failed(1),
            outcomes=((0, 10), (0, 11)),
            retried=2,
        )
    )
    await store.apply(StateWrite(3, None, outcomes=((1, 4),), dead_lettered=1))
    await store.record_delivered(3, [(0, 12), (DLQ - 1, 2**40)])
    snapshot = await store.load(3)
    assert snapshot.outcomes == {(0, 10), (0, 11), (1, 4), (0, 12), (DLQ - 1, 2**40)}
    assert await store.counters() == {"delivered_total": 2, "dead_lettered": 1, "retried": 2}


async def test_trim_forgets_outcomes_below_each_committed_offset(store: GroupStore) -> None:
    await store.record_delivered(0, [(0, 1), (0, 5), (0, 9), (1, 1), (1, 9), (2, 3)])
    await store.trim(0, {0: 6, 1: 2})
    assert (await store.load(0)).outcomes == {(0, 9), (1, 9), (2, 3)}
    await store.clear_outcomes(0, 1)
    assert (await store.load(0)).outcomes == {(0, 9), (2, 3)}


async def test_release_requests_are_taken_up_once(store: GroupStore) -> None:
    # Given an operator's request for group g and two single dead letters on partition 1
    await store.request_release(1, ["g"], [40, 41])
    assert await store.poll_releases(1) == ({"g"}, {40, 41})
    snapshot = await store.load(1)
    assert (snapshot.release_requests, snapshot.pending_releases) == ({"g"}, {40, 41})
    # When the worker takes up the group and delivers letter 40 again
    await store.apply(StateWrite(1, "g", release_request_done=True))
    await store.apply(StateWrite(1, None, releases_done=(40,), redelivered=(40,), delivered=1))
    # Then only letter 41 is left pending, and 40 is marked as delivered again
    assert await store.poll_releases(1) == (set(), {41})
    assert await store.redelivered(1) == {40}


async def test_dead_letters_retention_removed_are_forgotten(store: GroupStore) -> None:
    # Given letters 3 and 40 delivered again and 5 and 41 pending release on partition 1
    await store.apply(StateWrite(1, None, releases_done=(3, 40), redelivered=(3, 40)))
    await store.request_release(1, [], [5, 41])
    # When retention removed the DLQ up to offset 40
    await store.trim_dead_letters(1, 40)
    # Then only what can still be read is remembered
    assert await store.redelivered(1) == {40}
    assert await store.poll_releases(1) == (set(), {41})


async def test_a_lap_and_the_latest_failure_round_trip(store: GroupStore) -> None:
    state = GroupState(
        counts=failed(DLQ, 2).counts,
        head="m",
        dlq_from=12,
        version=4,
        lap=2,
        attempts=6,
        last_status=503,
        reason="http 503",
    )
    await store.apply(StateWrite(0, "g", touches_group=True, expected_version=0, state=state))
    assert await store.group("g") == state
    assert await store.states_of(["g", "h", "g"]) == {"g": state}


async def test_a_write_under_a_superseded_epoch_changes_nothing(store: GroupStore) -> None:
    # Given partition 2 claimed twice: epoch 1 is superseded by epoch 2
    old = await store.claim(2)
    new = await store.claim(2)
    assert new == old + 1
    await store.apply(StateWrite(2, "b", touches_group=True, expected_version=0, state=failed(1)))
    # When the first owner writes outcomes and state, alone or in a batch with the owner
    # of another partition
    mine = await store.claim(3)
    with pytest.raises(Fenced) as refused:
        await store.apply_batch(
            {2: [(0, 1)], 3: [(0, 2)]},
            [
                StateWrite(3, "a", touches_group=True, expected_version=0, state=failed(1)),
                StateWrite(2, "b", touches_group=True, expected_version=1, state=None),
            ],
            {2: old, 3: mine},
        )
    # Then nothing at all is applied, and the refused partition is named
    assert refused.value.partitions == (2,)
    assert (await store.load(2)).outcomes == set()
    assert (await store.load(3)).outcomes == set()
    assert await store.group("a") is None
    assert await store.group("b") == failed(1)
    with pytest.raises(Fenced):
        await store.apply(StateWrite(2, None, outcomes=((0, 5),)), old)
    # And the current owner's writes go through
    await store.apply(StateWrite(2, "b", touches_group=True, expected_version=1, state=None), new)
    assert await store.group("b") is None


async def test_fences_are_kept_for_the_latest_epochs(store: GroupStore) -> None:
    for epoch in range(1, 6):
        await store.record_fences(0, epoch, {1: epoch * 10, DLQ: epoch}, keep=3)
    assert (await store.load(0)).fences == {
        3: {1: 30, DLQ: 3},
        4: {1: 40, DLQ: 4},
        5: {1: 50, DLQ: 5},
    }
    assert (await store.load(1)).fences == {}
    assert await store.fences(0) == (await store.load(0)).fences


async def test_released_dlq_fields_round_trip(store: GroupStore) -> None:
    state = GroupState(
        counts=failed(DLQ, 2).counts, head=None, released=True, dlq_from=12, version=4
    )
    await store.apply(StateWrite(0, "g", touches_group=True, expected_version=0, state=state))
    assert await store.group("g") == state


async def test_seek_generations_are_remembered_per_partition(store: GroupStore) -> None:
    await store.mark_seek_applied(2, 3)
    assert (await store.load(2)).seek_generation == 3
    assert (await store.load(1)).seek_generation == 0


async def test_a_batch_records_outcomes_then_applies_writes_in_order(store: GroupStore) -> None:
    # Given group b already at version 1
    await store.apply(StateWrite(0, "b", touches_group=True, expected_version=0, state=failed(1)))
    # When one batch carries 2xx outcomes of two partitions and writes for a, b (stale), c
    with pytest.raises(StaleGroupState):
        await store.apply_batch(
            {0: [(0, 1), (0, 2)], 1: [(0, 7)]},
            [
                StateWrite(0, "a", touches_group=True, expected_version=0, state=failed(1)),
                StateWrite(0, "b", touches_group=True, expected_version=0, state=failed(2)),
                StateWrite(1, "c", touches_group=True, expected_version=0, state=failed(1)),
            ],
        )
    # Then the outcomes and the write before the stale one are applied, the rest are not
    assert (await store.load(0)).outcomes == {(0, 1), (0, 2)}
    assert (await store.load(1)).outcomes == {(0, 7)}
    assert await store.group("a") == failed(1)
    assert await store.group("b") == failed(1)
    assert await store.group("c") is None
    assert (await store.counters())["delivered_total"] == 3


async def test_a_large_batch_goes_through_in_one_call(store: GroupStore) -> None:
    outcomes = [(0, n) for n in range(5000)]
    writes = [
        StateWrite(0, f"g{n}", touches_group=True, expected_version=0, state=failed(1))
        for n in range(300)
    ]
    await store.apply_batch({0: outcomes}, writes)
    assert len((await store.load(0)).outcomes) == 5000
    assert await store.failed_count() == 300


async def test_delivered_again_offsets_of_an_older_version_are_adopted(redis_url: str) -> None:
    # Given the plain set an older version kept, with letters 3 and 7 delivered again
    project = f"t{uuid.uuid4().hex[:10]}"
    client: Redis[bytes] = Redis.from_url(redis_url)
    try:
        await client.sadd(keys.legacy_unsidelined(project, "s", 0), "3", "7")
        store = RedisGroupStore(client, project, "s")
        # When the store reads or trims them
        assert await store.redelivered(0) == {3, 7}
        await store.trim_dead_letters(0, 5)
        # Then they live on in the trimmed sorted set and the old set is gone
        assert await store.redelivered(0) == {7}
        assert not await client.exists(keys.legacy_unsidelined(project, "s", 0))
    finally:
        found = [k async for k in client.scan_iter(match=keys.subscription_pattern(project, "s"))]
        if found:
            await client.delete(*found)
        await client.aclose()  # type: ignore[attr-defined]


async def page_through(
    store: GroupStore, standing: Standing | None, limit: int
) -> list[list[tuple[str, str]]]:
    pages: list[list[tuple[str, str]]] = []
    after = None
    while True:
        page = await store.unhealthy(standing, limit, after)
        pages.append([(g.group_id, standing_of(g.state)[0].value) for g in page.groups])
        if page.next is None:
            return pages
        after = page.next


async def test_unhealthy_groups_are_listed_longest_unhealthy_first_in_pages(
    store: GroupStore,
) -> None:
    # Given 25 failed groups, made one after another; every fifth one parked in the DLQ
    names = [f"g{n:02d}" for n in range(25)]
    for n, group in enumerate(names):
        state = failed(DLQ if n % 5 == 0 else 1)
        await store.apply(StateWrite(n % 3, group, touches_group=True, state=state))
    # Then pages of 10 list each once, oldest first (ties by id), and end with no cursor
    pages = await page_through(store, None, 10)
    assert [len(p) for p in pages] == [10, 10, 5]
    assert [g for p in pages for g, _ in p] == names
    # And a standing lists only its own
    parked = [g for p in await page_through(store, Standing.DEAD_LETTERED, 2) for g, _ in p]
    assert parked == names[::5]
    retrying = [g for p in await page_through(store, Standing.RETRYING, 7) for g, _ in p]
    assert retrying == [g for n, g in enumerate(names) if n % 5]


async def test_a_group_keeps_its_place_while_its_standing_changes_and_leaves_when_healed(
    store: GroupStore,
) -> None:
    # Given two failed groups, "a" first
    await store.apply(StateWrite(0, "a", touches_group=True, state=failed(1)))
    await store.apply(StateWrite(0, "b", touches_group=True, state=failed(1)))
    first = (await store.unhealthy(None, 10, None)).groups
    # When "a" is parked in the DLQ
    parked = failed(DLQ, version=2)
    await store.apply(StateWrite(0, "a", touches_group=True, expected_version=1, state=parked))
    # Then it is still the oldest, now dead-lettered, since the same time
    now = (await store.unhealthy(None, 10, None)).groups
    assert [(g.group_id, standing_of(g.state)[0]) for g in now] == [
        ("a", Standing.DEAD_LETTERED),
        ("b", Standing.RETRYING),
    ]
    assert now[0].since_ms == first[0].since_ms
    # And once healthy it is gone from every listing
    await store.apply(StateWrite(0, "a", touches_group=True, expected_version=2, state=None))
    assert [g.group_id for g in (await store.unhealthy(None, 10, None)).groups] == ["b"]
    assert (await store.unhealthy(Standing.DEAD_LETTERED, 10, None)).groups == []


async def test_groups_failed_before_the_index_existed_are_indexed_when_listed(
    redis_url: str,
) -> None:
    # Given a failed group whose index entry is missing (written by an older version)
    project = f"t{uuid.uuid4().hex[:10]}"
    client: Redis[bytes] = Redis.from_url(redis_url)
    try:
        store = RedisGroupStore(client, project, "s")
        await store.apply(StateWrite(0, "old", touches_group=True, state=failed(DLQ)))
        await client.delete(keys.unhealthy(project, "s", "dead_lettered"))
        # Then listing finds it, dated by its failure
        [found] = (await store.unhealthy(None, 10, None)).groups
        assert (found.group_id, found.since_ms) == ("old", 7)
    finally:
        await store.clear()
        await client.aclose()  # type: ignore[attr-defined]


async def test_a_restore_holds_exactly_what_it_was_given_and_forgets_the_rest(
    redis_url: str,
) -> None:
    # Given a partition whose Redis knows groups "old" (parked) and "kept", a release request,
    # an outcome and fences, and another partition's group "other"
    project = f"t{uuid.uuid4().hex[:10]}"
    client: Redis[bytes] = Redis.from_url(redis_url)
    store = RedisGroupStore(client, project, "s")
    try:
        await store.apply(StateWrite(3, "old", touches_group=True, state=failed(DLQ)))
        await store.apply(StateWrite(3, "kept", touches_group=True, state=failed(1)))
        await store.apply(StateWrite(4, "other", touches_group=True, state=failed(1)))
        await store.request_release(3, ["old"], [11])
        await store.record_delivered(3, [(0, 5)])
        await store.record_fences(3, 1, {1: 4})
        # When a takeover restores what the changelog says: "kept" now parked at offset
        # 9007199254740993 (past what a double holds), "new" retrying, other requests,
        # pending releases, delivered-again letters, fences and a seek generation
        big = 9007199254740993
        kept = GroupState(
            counts=failed(DLQ).counts, head="h", version=4, dlq_from=big, failed_at_ms=big
        )
        new = failed(2, 2, head="n")
        await store.restore(
            3,
            7,
            {"kept": kept, "new": new},
            ["kept"],
            [big, 2],
            [5],
            3,
            {6: {1: 10, DLQ: big}, 7: {1: 12}},
        )
        # Then it loads exactly that under epoch 7, with the outcomes left as they were
        snap = await store.load(3)
        assert snap.states == {"kept": kept, "new": new}
        assert snap.release_requests == {"kept"}
        assert snap.pending_releases == {big, 2}
        assert snap.seek_generation == 3
        assert snap.fences == {6: {1: 10, DLQ: big}, 7: {1: 12}}
        assert snap.outcomes == {(0, 5)}
        assert snap.owner == (7, 0)
        assert await store.redelivered(3) == {5}
        assert 3 in await store.loaded()
        # And "old" is forgotten everywhere, each group listed under its standing once,
        # while the other partition's group is untouched
        assert await store.group("old") is None
        assert sorted(await store.failed_groups()) == ["kept", "new", "other"]
        listed = [
            (g.group_id, standing_of(g.state)[0])
            for g in (await store.unhealthy(None, 10, None)).groups
        ]
        assert sorted(listed) == [
            ("kept", Standing.DEAD_LETTERED),
            ("new", Standing.RETRYING),
            ("other", Standing.RETRYING),
        ]
        assert (await store.load(4)).states == {"other": failed(1)}
    finally:
        found = [k async for k in client.scan_iter(match=keys.subscription_pattern(project, "s"))]
        if found:
            await client.delete(*found)
        await client.aclose()  # type: ignore[attr-defined]
