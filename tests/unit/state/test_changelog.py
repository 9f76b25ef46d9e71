"""What a partition's changelog says once replayed (state/changelog.py): the latest record of
each key counts, tombstones remove, and a worker that had lost the partition is not heard."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from setu.ordering.state import EMPTY_COUNTS, GroupState, StateWrite
from setu.ordering.tiers import DLQ
from state.changelog import (
    PENDING,
    ChangelogRecord,
    Entry,
    PartitionReplay,
    born_record,
    cleared_record,
    decode_state,
    encode_state,
    group_record,
    letter_record,
    owner_record,
    records_of,
    release_record,
    seed_records,
    seek_record,
)

PARKED = GroupState(
    counts=tuple(3 if t == DLQ else 0 for t in range(len(EMPTY_COUNTS))),
    head="a-1",
    dlq_from=7,
    failed_at_ms=1234,
    version=4,
    attempts=3,
    last_status=400,
    reason="status 400",
    done=(5, 2, -1, -1, -1, -1, -1, -1, -1, -1, 6),
)


def replayed(records: Sequence[ChangelogRecord]) -> PartitionReplay:
    replay = PartitionReplay()
    replay.feed_all(
        [Entry(r.key, r.value, r.epoch, n) for n, r in enumerate(records)], len(records)
    )
    return replay


def test_a_group_state_survives_its_encoding() -> None:
    assert decode_state(encode_state(PARKED)) == PARKED


def test_the_latest_record_of_a_group_counts_and_a_tombstone_heals_it() -> None:
    retrying = replace(PARKED, counts=(0, 2, *EMPTY_COUNTS[2:]), version=1)
    replay = replayed(
        [
            owner_record(1, {}),
            group_record("g", retrying, 1),
            group_record("g", PARKED, 1),
            group_record("h", retrying, 1),
            group_record("h", None, 1),
        ]
    )
    assert replay.states == {"g": PARKED}
    assert replay.started and replay.epoch == 1 and replay.end == 5


def test_a_stale_workers_records_after_a_newer_claim_are_not_heard() -> None:
    # Given owner 1 parked g, then owner 2 claimed the partition
    healed = group_record("g", None, 1)
    replay = replayed(
        [
            owner_record(1, {}),
            group_record("g", PARKED, 1),
            owner_record(2, {1: {1: 40}}),
            # When the stalled owner 1 wakes up and writes on
            healed,
            release_record("g", True, 1),
        ]
    )
    # Then what it wrote is ignored, and marked to be said again by the owner
    assert replay.states == {"g": PARKED}
    assert replay.release_requests == set()
    assert replay.stale == {healed.key, b"r:g"}
    assert replay.record_for(healed.key, 3) == group_record("g", PARKED, 3)
    assert replay.epoch == 2 and replay.fences == {1: {1: 40}}


def test_an_operators_release_is_never_stale_and_ends_when_taken_up() -> None:
    requested = release_record("g", True, None)  # written by the API, which owns nothing
    replay = replayed([owner_record(5, {}), requested])
    assert replay.release_requests == {"g"}
    taken = StateWrite(0, "g", touches_group=True, state=PARKED, release_request_done=True)
    replay = replayed([owner_record(5, {}), requested, *records_of(taken, 5)])
    assert replay.release_requests == set()
    assert replay.states == {"g": PARKED}


def test_single_letters_pending_then_delivered_again_then_trimmed() -> None:
    again = StateWrite(0, None, redelivered=(11,), releases_done=(11,))
    records = [
        owner_record(1, {}),
        letter_record(11, PENDING, None),
        letter_record(12, PENDING, None),
    ]
    replay = replayed(records)
    assert (replay.pending, replay.redelivered) == ({11, 12}, set())
    replay = replayed([*records, *records_of(again, 1)])
    assert (replay.pending, replay.redelivered) == ({12}, {11})
    replay = replayed([*records, *records_of(again, 1), letter_record(11, None, 1)])
    assert (replay.pending, replay.redelivered) == ({12}, set())


def test_a_partition_from_before_the_changelog_is_seeded_from_redis() -> None:
    seeded = seed_records({"g": PARKED}, ["g"], [3], [4, 3], 2, 1)
    replay = replayed([*seeded, owner_record(1, {})])
    assert replay.states == {"g": PARKED}
    assert replay.release_requests == {"g"}
    assert (replay.pending, replay.redelivered) == ({3}, {4})
    assert replay.seek_generation == 2
    assert replayed([seek_record(3, 1)]).seek_generation == 3
    assert not replayed(seeded).started  # no owner record yet


def test_a_subscription_born_and_never_claimed_is_the_only_one_known_to_have_no_offsets() -> None:
    # A subscription the API created: nobody can have committed in its group
    assert replayed([born_record()]).never_owned
    # Claimed since (whichever came first, the claim or the API's record): an owner commits
    assert not replayed([born_record(), owner_record(1, {})]).never_owned
    assert not replayed([owner_record(1, {}), born_record()]).never_owned
    # Nothing said: a subscription of an earlier version, its offsets must be asked
    assert not replayed([]).never_owned
    # Deleted (its group with it) and created again under its name: born again
    again = replayed([born_record(), owner_record(3, {}), cleared_record(), born_record()])
    assert again.never_owned and again.epoch == 3
    # Deleted and not created again: nothing is known
    assert not replayed([born_record(), cleared_record()]).never_owned
    assert replayed([born_record()]).copy().never_owned
