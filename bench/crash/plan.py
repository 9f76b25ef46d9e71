"""The receiver's failure plan, and the pure decision of what status to answer.

During the run the receiver answers 503 to every call of a *failing group* inside that group's
time windows, and a 4xx to every call of a *rejected message*. Short windows end before the
subscription's retry tiers run out, so the group recovers in a retry tier; long ones outlast
them, so the group is dead-lettered and parked. A rejected message is dead-lettered at once and
parks its group (docs/design.md §3, ``park`` policy).

A window opens at the group's first call at or after its planned start and lasts its planned
length from there (:class:`FailureSchedule`). Fixed wall-clock windows would mostly fall between
calls: a group gets a call every few seconds, and deliveries come in bursts whenever a killed
ingest job catches up, so a run could end without a single 503 and never exercise the retry
tiers.

An *outage* is a window in which the receiver answers 503 to every call, whatever its group:
the endpoint is down. Like a group's window it opens at the first call at or after its planned
start (the receiver journals when: ``outage.started`` among its events). It lasts longer than
the subscription's circuit breaker needs to open and probe (docs/policies.md §2), so the run
sees the breaker open, fail probes and close. Chaos can stall every call for the whole planned
length (an ingest job restarting, workers killed): the outage then goes on past its length until
it has failed ``outage_min_failures`` calls, up to ``OUTAGE_STRETCH`` times its length, so the
breakers always get calls to open on (the receiver journals ``outage.ended``).

A *flaky group* fails each of its messages' first k calls with 503 (k at most the number of
retry tiers), then answers 200: the everyday flaky endpoint. Every message keeps its own retry
budget (docs/delivery.md), so none of these messages may reach the DLQ.

When the harness switches the receiver to the ``drain`` phase it answers 2xx to everything but
the first call of a rejected message not called before (4xx), and the harness unsidelines the
dead-lettered groups until none is left. So in the end every accepted message has a 2xx, and each
group's first-2xx order must equal its full published order: nothing is "minus dead-lettered"
under ``park``, the dead-lettered messages are delivered, in order, after the unsideline.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from bench.crash.records import group_name, is_stream_lane, make_record

REJECT_STATUS = 422
FAIL_STATUS = 503
# How many times its planned length an outage may run while it waits for enough failed calls.
OUTAGE_STRETCH = 4


class Phase(StrEnum):
    """``run``: follow the plan. ``drain``: answer 2xx to everything."""

    RUN = "run"
    DRAIN = "drain"


@dataclass(frozen=True, slots=True)
class FailurePlan:
    """Which groups fail when (epoch ms, half-open windows) and which message ids are rejected."""

    windows: dict[str, tuple[tuple[int, int], ...]] = field(default_factory=dict)
    rejected: frozenset[str] = frozenset()
    flaky: dict[str, int] = field(default_factory=dict)  # group -> failed calls per message
    outage: tuple[int, int] | None = None  # every call fails in [start, end)
    # The outage lasts past its length until it failed this many calls (OUTAGE_STRETCH caps it)
    outage_min_failures: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "windows": {group: [list(w) for w in ws] for group, ws in self.windows.items()},
            "rejected": sorted(self.rejected),
            "flaky": self.flaky,
            "outage": None if self.outage is None else list(self.outage),
            "outage_min_failures": self.outage_min_failures,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> FailurePlan:
        windows = {
            group: tuple((int(start), int(end)) for start, end in spans)
            for group, spans in data.get("windows", {}).items()
        }
        flaky = {group: int(k) for group, k in data.get("flaky", {}).items()}
        outage = data.get("outage")
        return cls(
            windows=windows,
            rejected=frozenset(data.get("rejected", ())),
            flaky=flaky,
            outage=None if outage is None else (int(outage[0]), int(outage[1])),
            outage_min_failures=int(data.get("outage_min_failures", 0)),
        )


class FailureSchedule:
    """The plan's windows as they actually open: window *i* of a group opens at the group's
    first call at or after both its planned start and the close of window *i - 1*, and stays
    open for its planned length."""

    def __init__(self, plan: FailurePlan) -> None:
        self.plan = plan
        self._opened: dict[str, list[int]] = {}
        # When the outage opened: at the first call at or after its planned start, as a
        # group's window (calls may pause for a while when chaos stalls ingest or delivery).
        self.outage_started: int | None = None
        # When it ended (the first call it let through) and how many calls it failed until then
        self.outage_ended: int | None = None
        self.outage_failures = 0

    def resume_outage(self, started: int | None, ended: int | None, failures: int) -> None:
        """Take up the outage where a receiver that died left it (from its journals)."""
        self.outage_started, self.outage_ended, self.outage_failures = started, ended, failures

    def in_outage(self, now_ms: int) -> bool:
        """Whether a call at ``now_ms`` falls in the outage (it may open or end it)."""
        outage = self.plan.outage
        if outage is None or self.outage_ended is not None:
            return False
        if self.outage_started is None:
            if now_ms < outage[0]:
                return False
            self.outage_started = now_ms
        elapsed = now_ms - self.outage_started
        length = _length(outage)
        short = self.outage_failures < self.plan.outage_min_failures
        if elapsed < length or (short and elapsed < length * OUTAGE_STRETCH):
            self.outage_failures += 1
            return True
        self.outage_ended = now_ms
        return False

    def failing(self, group_id: str, now_ms: int) -> bool:
        """Whether a call of ``group_id`` at ``now_ms`` falls in an open window (it may open
        one). Calls must come in time order."""
        windows = self.plan.windows.get(group_id, ())
        if not windows:
            return False
        opened = self._opened.setdefault(group_id, [])
        for index, (start, end) in enumerate(windows):
            if index == len(opened):
                previous_close = opened[-1] + _length(windows[index - 1]) if opened else 0
                if now_ms < max(start, previous_close):
                    return False
                opened.append(now_ms)
            if now_ms < opened[index] + _length((start, end)):
                return True
        return False


def _length(window: tuple[int, int]) -> int:
    return window[1] - window[0]


def decide_status(
    schedule: FailureSchedule,
    phase: Phase,
    group_id: str,
    message_id: str,
    now_ms: int,
    calls_before: int = 0,
) -> int:
    """The status the receiver answers to one call (calls in time order); ``calls_before`` is
    how many calls of the same message it answered before."""
    if phase is Phase.DRAIN:
        # A rejected message that was never called gets its 4xx here: on a slow run it may
        # reach the webhook only now, and the run must still see a rejection and an unsideline
        rejected = message_id in schedule.plan.rejected and calls_before == 0
        return REJECT_STATUS if rejected else 200
    if schedule.in_outage(now_ms):
        return FAIL_STATUS
    if message_id in schedule.plan.rejected:
        return REJECT_STATUS
    if schedule.failing(group_id, now_ms):
        return FAIL_STATUS
    if calls_before < schedule.plan.flaky.get(group_id, 0):
        return FAIL_STATUS
    return 200


@dataclass(frozen=True, slots=True)
class PlanShape:
    """How much to fail. Times are in ms; windows fall inside [start_ms, start_ms + span_ms)."""

    run_id: str
    groups: int
    lanes: int
    messages_per_lane: int
    start_ms: int
    span_ms: int
    failing_group_fraction: float = 0.1
    windows_per_group: int = 2
    short_window_ms: tuple[int, int] = (300, 1_200)
    long_window_ms: tuple[int, int] = (3_000, 8_000)
    long_window_fraction: float = 0.3
    rejected_messages: int = 5
    flaky_group_fraction: float = 0.05
    max_flaky_failures: int = 2  # at most the subscription's number of retry tiers
    outage_ms: int = 0  # 0: no outage
    outage_at: float = 0.4  # where in the span the outage begins (a fraction)
    outage_min_failures: int = 0  # FailurePlan.outage_min_failures
    stream_lanes: int = 0  # the last lanes stream (bench.crash.records.is_stream_lane)


# Draws per rejected message before make_plan settles for fewer (every group failing).
REJECT_DRAWS = 20


def make_plan(shape: PlanShape, seed: int) -> FailurePlan:
    """A reproducible plan: the same shape and seed give the same plan."""
    rng = random.Random(seed)
    failing = rng.sample(range(shape.groups), round(shape.groups * shape.failing_group_fraction))
    windows: dict[str, tuple[tuple[int, int], ...]] = {}
    for index in sorted(failing):
        spans = []
        for _ in range(shape.windows_per_group):
            low, high = (
                shape.long_window_ms
                if rng.random() < shape.long_window_fraction
                else shape.short_window_ms
            )
            length = rng.randint(low, high)
            start = shape.start_ms + rng.randint(0, max(0, shape.span_ms - length))
            spans.append((start, start + length))
        windows[group_name(index)] = tuple(sorted(spans))
    rejected: set[str] = set()
    down = {group_name(index) for index in failing}
    # From the first quarter of a lane, and never of a failing group: a slow run produces
    # fewer messages than planned (a node-loss run on a slow machine, half), and a failing
    # group's later messages wait behind it once it is parked. A run whose five picks all came
    # late or behind a parked group ended without a single 4xx (seed 1527516047).
    for _ in range(shape.rejected_messages * REJECT_DRAWS):
        if len(rejected) == shape.rejected_messages:
            break
        lane = rng.randrange(shape.lanes)
        record = make_record(
            shape.run_id,
            shape.groups,
            shape.lanes,
            lane,
            rng.randrange(max(1, shape.messages_per_lane // 4)),
            stream=is_stream_lane(lane, shape.lanes, shape.stream_lanes),
        )
        if record.group_id not in down:
            rejected.add(record.message_id)
    healthy = sorted(set(range(shape.groups)) - set(failing))
    count = min(len(healthy), round(shape.groups * shape.flaky_group_fraction))
    flaky = {
        group_name(index): rng.randint(1, shape.max_flaky_failures)
        for index in sorted(rng.sample(healthy, count))
    }
    outage = None
    if shape.outage_ms:
        begins = shape.start_ms + int(shape.span_ms * shape.outage_at)
        outage = (begins, begins + shape.outage_ms)
    return FailurePlan(
        windows=windows,
        rejected=frozenset(rejected),
        flaky=flaky,
        outage=outage,
        outage_min_failures=shape.outage_min_failures,
    )
