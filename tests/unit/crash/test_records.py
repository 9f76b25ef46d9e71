"""Crash-test records are a pure function of their identity."""

from __future__ import annotations

import pytest

from bench.crash.records import (
    MANY_HEADERS,
    SCHEDULE_EVERY,
    is_stream_lane,
    lane_groups,
    make_record,
    payload_hash,
    producer_name,
)


def test_same_identity_gives_the_same_bytes() -> None:
    # A restarted producer must re-send exactly what it sent before.
    assert make_record("r1", 100, 10, 3, 42) == make_record("r1", 100, 10, 3, 42)


def test_records_are_unique_across_lanes_sequences_and_runs() -> None:
    records = [
        make_record(run, 20, 4, lane, seq)
        for run in ("r1", "r2")
        for lane in range(4)
        for seq in range(50)
    ]
    assert len({r.message_id for r in records}) == len(records)
    assert len({r.body for r in records}) == len(records)


def test_a_lane_only_publishes_to_its_own_groups() -> None:
    owned = set(lane_groups(100, 10, 7))
    groups = {make_record("r", 100, 10, 7, seq).group_id for seq in range(500)}
    assert groups == owned


def test_lanes_partition_the_groups() -> None:
    all_groups = [g for lane in range(7) for g in lane_groups(50, 7, lane)]
    assert len(all_groups) == len(set(all_groups)) == 50


@pytest.mark.parametrize(("groups", "lanes", "lane"), [(5, 6, 0), (10, 2, 2), (10, 2, -1)])
def test_impossible_lane_layouts_are_refused(groups: int, lanes: int, lane: int) -> None:
    with pytest.raises(ValueError):
        lane_groups(groups, lanes, lane)


def test_record_identity_fits_the_header_rules() -> None:
    record = make_record("run-0123456789abcdef", 1000, 20, 19, 2**40)
    assert record.producer_id == producer_name("run-0123456789abcdef", 19)
    assert record.message_id == f"{record.producer_id}-{2**40}"
    assert len(record.message_id) <= 100
    assert record.body.startswith(f"{record.message_id}|{record.group_id}|".encode())
    assert record.payload_hash == payload_hash(record.body)


def test_a_few_records_are_at_the_size_limit_or_carry_many_headers() -> None:
    # Given the records of one lane made with the API's size limit
    limit = 1024 * 1024
    records = [make_record("r", 10, 2, 0, seq, large_body_bytes=limit) for seq in range(3000)]
    sizes = {len(r.body) for r in records}
    # Then some bodies are exactly the limit, some one byte under, a few carry many headers,
    # and the rest stay small; the same arguments give the same bytes
    assert {limit, limit - 1} <= sizes
    assert sum(r.extra_headers == MANY_HEADERS for r in records) >= 3
    assert sum(len(r.body) < 200 for r in records) > 2900
    again = make_record("r", 10, 2, 0, 17, large_body_bytes=limit)
    assert again == records[17]
    # And without a limit every record is small
    assert all(len(make_record("r", 10, 2, 0, s).body) < 200 for s in range(300))


def test_stream_lanes_are_the_last_and_their_ids_are_the_ones_setu_makes() -> None:
    assert [is_stream_lane(lane, 10, 3) for lane in range(10)] == [False] * 7 + [True] * 3
    streamed = make_record("r", 100, 10, 9, 4, stream=True)
    assert streamed.message_id == f"{streamed.producer_id}:4"
    # The same group and body as over HTTP, only the id differs
    sent = make_record("r", 100, 10, 9, 4)
    assert streamed.group_id == sent.group_id
    assert streamed.body.replace(b":", b"-", 1) == sent.body
    # X_* headers cannot travel on a stream: no streamed record carries any
    assert not any(
        make_record("r", 100, 10, 9, n, 1024, stream=True).extra_headers for n in range(2_000)
    )


def test_some_http_records_are_scheduled_and_streamed_ones_never() -> None:
    # docs/scheduling.md: a few messages of each HTTP lane hold their group back for a while
    http = [make_record("run", 100, 10, 0, n) for n in range(2_000)]
    streamed = [make_record("run", 100, 10, 9, n, stream=True) for n in range(2_000)]
    later = [r.deliver_after_ms for r in http if r.deliver_after_ms]
    assert len(later) >= 2_000 // SCHEDULE_EVERY // 2
    assert all(500 <= ms <= 500 + 255 * 20 for ms in later)
    assert not any(r.deliver_after_ms for r in streamed)
    # And the same arguments give the same schedule (a restarted producer resends the same)
    assert make_record("run", 100, 10, 0, 7) == http[7]
