"""The receiver's failure plan and its status decision."""

from __future__ import annotations

import pytest

from bench.crash.plan import (
    FAIL_STATUS,
    REJECT_STATUS,
    FailurePlan,
    FailureSchedule,
    Phase,
    PlanShape,
    decide_status,
    make_plan,
)
from bench.crash.records import make_record

PLAN = FailurePlan(windows={"g1": ((1_000, 2_000), (5_000, 5_500))}, rejected=frozenset({"m-bad"}))


@pytest.mark.parametrize(
    ("phase", "group", "message", "now", "status"),
    [
        (Phase.RUN, "g1", "m1", 999, 200),
        (Phase.RUN, "g1", "m1", 1_000, FAIL_STATUS),
        (Phase.RUN, "g2", "m1", 1_500, 200),
        (Phase.RUN, "g2", "m-bad", 0, REJECT_STATUS),
        (Phase.RUN, "g1", "m-bad", 1_500, REJECT_STATUS),
        (Phase.DRAIN, "g1", "m1", 1_500, 200),
    ],
)
def test_decide_status(phase: Phase, group: str, message: str, now: int, status: int) -> None:
    assert decide_status(FailureSchedule(PLAN), phase, group, message, now) == status


def test_a_rejected_message_first_called_in_the_drain_is_rejected_once() -> None:
    # A slow run reached some rejected messages only after the producer stopped: the run then
    # saw no 4xx and no unsideline at all
    schedule = FailureSchedule(PLAN)
    answers = [decide_status(schedule, Phase.DRAIN, "g2", "m-bad", 0, n) for n in range(3)]
    assert answers == [REJECT_STATUS, 200, 200]


def statuses(schedule: FailureSchedule, group: str, times: list[int]) -> list[int]:
    return [decide_status(schedule, Phase.RUN, group, "m", t) for t in times]


def test_a_window_opens_at_the_groups_first_call_after_its_planned_start() -> None:
    # Given windows planned at [1000, 2000) and [5000, 5500)
    schedule = FailureSchedule(PLAN)
    # When the group's calls come before, long after and during the planned windows
    got = statuses(schedule, "g1", [500, 3_000, 3_999, 4_000, 5_000, 5_600, 6_000])
    # Then the first window opens at 3000 and lasts its 1000 ms; the second opens at 5000 and
    # lasts 500 ms
    assert got == [200, FAIL_STATUS, FAIL_STATUS, 200, FAIL_STATUS, 200, 200]


def test_a_window_waits_for_the_previous_one_to_close() -> None:
    # Given windows planned at [1000, 2000) and [1500, 1600)
    schedule = FailureSchedule(FailurePlan(windows={"g": ((1_000, 2_000), (1_500, 1_600))}))
    # When the first window opens late, at 1800
    got = statuses(schedule, "g", [1_800, 2_700, 2_800, 2_850, 2_900])
    # Then the second opens only at the first call after the first closed (2800), for 100 ms
    assert got == [FAIL_STATUS, FAIL_STATUS, FAIL_STATUS, FAIL_STATUS, 200]


def test_other_groups_are_never_failed() -> None:
    schedule = FailureSchedule(PLAN)
    assert statuses(schedule, "g2", [0, 1_000, 1_500, 5_000]) == [200] * 4


def test_plan_survives_json() -> None:
    assert FailurePlan.from_json(PLAN.to_json()) == PLAN


SHAPE = PlanShape(
    run_id="r", groups=100, lanes=10, messages_per_lane=300, start_ms=10_000, span_ms=60_000
)


def test_plan_is_reproducible_from_its_seed() -> None:
    assert make_plan(SHAPE, 7) == make_plan(SHAPE, 7)
    assert make_plan(SHAPE, 7) != make_plan(SHAPE, 8)


def test_plan_fails_the_asked_share_of_groups_inside_the_span() -> None:
    plan = make_plan(SHAPE, 1)
    assert len(plan.windows) == 10
    for spans in plan.windows.values():
        assert len(spans) == 2
        for start, end in spans:
            assert SHAPE.start_ms <= start < end <= SHAPE.start_ms + SHAPE.span_ms
            assert 300 <= end - start <= 8_000


def test_plan_rejects_messages_the_producer_will_publish() -> None:
    plan = make_plan(SHAPE, 1)
    published = {
        make_record("r", 100, 10, lane, seq).message_id for lane in range(10) for seq in range(300)
    }
    assert 1 <= len(plan.rejected) <= 5
    assert plan.rejected <= published


def test_rejected_messages_come_early_in_their_lane_and_never_from_a_failing_group() -> None:
    # A message never produced (a slow run), or waiting behind its parked failing group, is
    # never rejected: a run ended with no 4xx at all
    for seed in range(200):
        plan = make_plan(SHAPE, seed)
        early = {
            record.message_id: record.group_id
            for lane in range(10)
            for seq in range(75)
            if (record := make_record("r", 100, 10, lane, seq)).message_id in plan.rejected
        }
        assert set(early) == plan.rejected, seed
        assert not set(early.values()) & set(plan.windows), seed
        assert len(plan.rejected) == 5, seed


def test_a_flaky_group_fails_each_message_its_first_calls_then_succeeds() -> None:
    # Given a plan whose group f fails each message's first two calls
    schedule = FailureSchedule(FailurePlan(flaky={"f": 2}))
    # Then each message gets 503, 503, then 200, whatever the other messages got
    answers = [decide_status(schedule, Phase.RUN, "f", "m1", 0, before) for before in range(4)]
    assert answers == [FAIL_STATUS, FAIL_STATUS, 200, 200]
    assert decide_status(schedule, Phase.RUN, "f", "m2", 0, 0) == FAIL_STATUS
    assert decide_status(schedule, Phase.RUN, "g", "m3", 0, 0) == 200
    assert decide_status(schedule, Phase.DRAIN, "f", "m4", 0, 0) == 200


def test_plan_makes_flaky_groups_apart_from_the_failing_ones() -> None:
    plan = make_plan(SHAPE, 1)
    assert len(plan.flaky) == 5
    assert not set(plan.flaky) & set(plan.windows)
    assert set(plan.flaky.values()) <= {1, 2}
    assert FailurePlan.from_json(plan.to_json()) == plan
