"""A message's delivery record (delivery/attempts.py): what is recorded, and the view."""

from __future__ import annotations

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from delivery import attempts as attempts_module
from delivery.attempts import AttemptRecorder
from setu.envelope import Envelope
from setu.ordering.groups import Kind
from setu.ordering.records import Record
from setu.outcome import Outcome, Verdict
from state.attempt_log import StubAttemptLog, delivery_record


def record(tier: int = 0, message_id: str = "m1") -> Record:
    return Record(tier, 5, Envelope(message_id, b"{}", group_id="g"))


async def test_attempts_and_moves_read_back_as_the_message_s_story() -> None:
    # Given a message that failed twice in main, moved to rq.1, then was delivered there
    log = StubAttemptLog(clock=lambda: 10_000)
    recorder = AttemptRecorder(log)
    fail = Outcome(Verdict.RETRY, status=503, excerpt='{"busy": true}')
    recorder.called(record(), 1, fail, 1_000, 12.34)
    recorder.called(record(), 2, Outcome(Verdict.RETRY, error="timeout"), 2_000, 5_000)
    recorder.moved([record()], 1, Kind.HEAD, 2_100)
    recorder.called(record(1), 3, Outcome(Verdict.DELIVERED, status=200), 3_000, 8)
    await recorder.flush()
    view = delivery_record("m1", await log.read("m1"))
    # Then each attempt and the move are there in order, and it reads as delivered
    assert view["location"] == "delivered"
    assert [(a["attempt"], a["tier"], a["outcome"], a["status"]) for a in view["attempts"]] == [
        (1, "main", "retry", 503),
        (2, "main", "retry", None),
        (3, "rq.1", "delivered", 200),
    ]
    assert view["attempts"][0]["response_excerpt"] == '{"busy": true}'
    assert view["attempts"][0]["duration_ms"] == 12.3
    assert view["attempts"][1]["error"] == "timeout"
    assert view["moves"] == [{"at_ms": 2_100, "to": "rq.1", "why": "head"}]


def test_where_a_message_waits_follows_its_last_entry() -> None:
    attempt = {"t": 1, "a": 1, "tier": "rq.2", "v": "retry", "ms": 1.0}
    assert delivery_record("m", [attempt])["location"] == "rq.2"
    parked = {"t": 2, "to": "dlq", "k": "park"}
    assert delivery_record("m", [attempt, parked])["location"] == "dlq"
    assert delivery_record("m", [parked])["attempts"] == []


async def test_entries_redis_did_not_take_wait_for_the_next_flush_then_the_oldest_drop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class Down(StubAttemptLog):
        up = False

        async def append(self, entries):  # type: ignore[no-untyped-def]
            if not self.up:
                raise RedisConnectionError("down")
            await super().append(entries)

    dropped: list[int] = []
    log = Down(clock=lambda: 10_000)
    recorder = AttemptRecorder(log, dropped.append)
    monkeypatch.setattr(attempts_module, "MAX_BUFFERED", 3)
    for n in range(5):
        recorder.called(record(message_id=f"m{n}"), 1, Outcome(Verdict.DELIVERED), 1_000, 1)
        await recorder.flush()
    # Redis away: 3 kept, the 2 oldest dropped and counted
    assert sum(dropped) == 2
    log.up = True
    await recorder.flush()
    assert [m for m, _ in log.entries] == ["m2", "m3", "m4"]
