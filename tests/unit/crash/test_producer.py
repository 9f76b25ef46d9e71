"""The replayable producer against a fake produce API (pure dedup logic, no Kafka)."""

from __future__ import annotations

import asyncio
import random
import time
from collections import defaultdict
from pathlib import Path

import httpx
import pytest

from bench.crash.checker import published_from_journal
from bench.crash.journal import Journal, read_entries
from bench.crash.producer import (
    LaneProgress,
    Pacer,
    Producer,
    ProducerConfig,
    ResumePoint,
    lane_progress,
    produce_headers,
    resume_point,
)
from bench.crash.records import make_record
from setu.headers import parse_produce_headers

CONFIG = ProducerConfig(
    api="http://setu",
    project="p",
    topic="t",
    run_id="run",
    groups=12,
    lanes=3,
    messages_per_lane=40,
    rate_per_second=0.0,
    backoff_s=(0.001, 0.005),
)


class FakeSetu:
    """Produce API with Pulsar-style dedup and scripted faults.

    ``fail_rate``: answer 503 without keeping the message. ``lose_ack_rate``: keep the message
    but answer 503, as when the API dies after the Kafka ack. ``server_lag``: how far
    ``GET .../producers/{id}`` trails the highest accepted sequence.
    """

    def __init__(self, seed: int = 0, fail_rate: float = 0.0, lose_ack_rate: float = 0.0):
        self.rng = random.Random(seed)
        self.fail_rate = fail_rate
        self.lose_ack_rate = lose_ack_rate
        self.server_lag = 0
        self.marks: dict[str, int] = defaultdict(lambda: -1)
        self.main_log: list[tuple[str, int, str, bytes]] = []
        self.requests = 0
        self.trip_at: int | None = None
        self.tripped = asyncio.Event()

    def trip_after(self, requests: int) -> asyncio.Event:
        """An event set once ``requests`` more requests have arrived."""
        self.trip_at = self.requests + requests
        self.tripped = asyncio.Event()
        return self.tripped

    def handler(self, request: httpx.Request) -> httpx.Response:
        self.requests += 1
        if self.trip_at is not None and self.requests >= self.trip_at:
            self.tripped.set()
        if request.method == "GET":
            producer = request.url.path.rsplit("/", 1)[1]
            last = max(-1, self.marks[producer] - self.server_lag)
            return httpx.Response(200, json={"producer_id": producer, "last_sequence_id": last})
        roll = self.rng.random()
        if roll < self.fail_rate:
            return httpx.Response(503, json={"error": {"code": "x", "message": "down"}})
        ids = parse_produce_headers(request.headers.items(), grouped=True)
        assert ids.producer_id is not None and ids.sequence_id is not None
        if ids.sequence_id > self.marks[ids.producer_id]:
            self.marks[ids.producer_id] = ids.sequence_id
            self.main_log.append(
                (ids.producer_id, ids.sequence_id, ids.message_id, request.content)
            )
        if roll < self.fail_rate + self.lose_ack_rate:
            return httpx.Response(503)
        return httpx.Response(200, json={"message_id": ids.message_id})


def client_for(fake: FakeSetu) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.MockTransport(fake.handler), base_url=CONFIG.api)


async def run_producer(
    fake: FakeSetu, path: Path, *, stop_after_requests: int | None = None
) -> bool:
    """Run until done, or cancel it mid-flight (like SIGKILL) after some requests."""
    entries = read_entries(path)
    journal = await Journal(path).open()
    async with client_for(fake) as client:
        task = asyncio.create_task(Producer(CONFIG, client, journal).run(entries))
        if stop_after_requests is None:
            finished = await task
        else:
            tripped = asyncio.create_task(fake.trip_after(stop_after_requests).wait())
            await asyncio.wait([task, tripped], return_when=asyncio.FIRST_COMPLETED)
            tripped.cancel()
            task.cancel()
            finished = False
            await asyncio.gather(task, return_exceptions=True)
    await journal.close()
    return finished


def assert_every_record_once_in_order(fake: FakeSetu) -> None:
    per_lane: dict[str, list[int]] = defaultdict(list)
    for producer, seq, mid, body in fake.main_log:
        per_lane[producer].append(seq)
        lane = int(producer.rsplit("p", 1)[1])
        assert make_record("run", 12, 3, lane, seq).body == body
        assert mid == f"{producer}-{seq}"
    assert len(per_lane) == CONFIG.lanes
    for seqs in per_lane.values():
        assert seqs == list(range(CONFIG.messages_per_lane))


@pytest.mark.parametrize(
    ("entries", "progress"),
    [
        ([], LaneProgress(-1, -1)),
        ([{"e": "sent", "pid": "a", "seq": 0}], LaneProgress(-1, 0)),
        (
            [{"e": "sent", "pid": "a", "seq": 0}, {"e": "ack", "pid": "a", "seq": 0}],
            LaneProgress(0, 0),
        ),
        (
            [
                {"e": "sent", "pid": "a", "seq": 4},
                {"e": "ack", "pid": "a", "seq": 4},
                {"e": "sent", "pid": "b", "seq": 9},
                {"e": "sent", "pid": "a", "seq": 5},
                {"e": "start", "t": 0},
            ],
            LaneProgress(4, 5),
        ),
        ([{"e": "ack", "pid": "a", "seq": 7, "via": "server"}], LaneProgress(7, 7)),
    ],
)
def test_lane_progress(entries: list[dict[str, object]], progress: LaneProgress) -> None:
    assert lane_progress(entries, "a") == progress


@pytest.mark.parametrize(
    ("progress", "server_last", "point"),
    [
        # fresh lane
        (LaneProgress(-1, -1), -1, ResumePoint(0, ())),
        # killed while 5 was in flight: re-send 5 with the same ids
        (LaneProgress(4, 5), 4, ResumePoint(5, ())),
        # the server already has 5: journal it as acked, go on with 6
        (LaneProgress(4, 5), 5, ResumePoint(6, (5,))),
        # the server lags behind the journal (ingest has not caught up): trust the journal
        (LaneProgress(9, 9), 3, ResumePoint(10, ())),
        # journal lost: everything the server has is confirmed
        (LaneProgress(-1, -1), 2, ResumePoint(3, (0, 1, 2))),
    ],
)
def test_resume_point(progress: LaneProgress, server_last: int, point: ResumePoint) -> None:
    assert resume_point(progress, server_last) == point


@pytest.mark.parametrize("lane", [0, 1])
def test_produce_headers_are_valid_in_both_spellings(lane: int) -> None:
    record = make_record("run", 12, 3, lane, 5)
    parsed = parse_produce_headers(produce_headers(record, lane).items(), grouped=True)
    assert (parsed.message_id, parsed.group_id, parsed.producer_id, parsed.sequence_id) == (
        record.message_id,
        record.group_id,
        record.producer_id,
        5,
    )
    assert any("_" in name for name in produce_headers(record, lane)) == (lane % 2 == 0)


async def test_retries_through_failures_until_every_record_is_acked(tmp_path: Path) -> None:
    # Given an API that fails a third of the calls, half of them after keeping the message
    fake = FakeSetu(seed=1, fail_rate=0.15, lose_ack_rate=0.15)
    # When the producer runs to the end
    assert await run_producer(fake, tmp_path / "p.log")
    # Then every record is in the main log exactly once, in lane order, and journalled as acked
    assert_every_record_once_in_order(fake)
    published = published_from_journal(read_entries(tmp_path / "p.log"))
    assert len(published) == CONFIG.lanes * CONFIG.messages_per_lane
    assert all(p.acked for p in published)


async def test_resumes_after_repeated_kills_without_loss_or_reorder(tmp_path: Path) -> None:
    # Given a flaky API and a producer killed mid-flight many times
    fake = FakeSetu(seed=2, fail_rate=0.1, lose_ack_rate=0.2)
    fake.server_lag = 2
    path = tmp_path / "p.log"
    rng = random.Random(3)
    for _ in range(8):
        await run_producer(fake, path, stop_after_requests=rng.randint(1, 25))
    # When it finally runs to the end
    assert await run_producer(fake, path)
    # Then Setu holds every record once, in order, and the journal knows them all as acked
    assert_every_record_once_in_order(fake)
    published = published_from_journal(read_entries(path))
    assert [p.message_id for p in published if not p.acked] == []
    assert len(published) == CONFIG.lanes * CONFIG.messages_per_lane


async def test_resumes_from_the_server_when_the_journal_is_gone(tmp_path: Path) -> None:
    # Given Setu already holds the first 10 records of every lane, and the journal was lost
    fake = FakeSetu()
    for lane in range(CONFIG.lanes):
        for seq in range(10):
            record = make_record("run", 12, 3, lane, seq)
            fake.marks[record.producer_id] = seq
            fake.main_log.append((record.producer_id, seq, record.message_id, record.body))
    # When a producer starts with an empty journal
    assert await run_producer(fake, tmp_path / "p.log")
    # Then it journals those 10 as acknowledged by the server and sends only the rest
    entries = read_entries(tmp_path / "p.log")
    assert sum(e.get("via") == "server" for e in entries) == 10 * CONFIG.lanes
    assert fake.requests == CONFIG.lanes * (1 + CONFIG.messages_per_lane - 10)
    assert_every_record_once_in_order(fake)


async def test_stop_leaves_at_most_one_unacknowledged_record_per_lane(tmp_path: Path) -> None:
    # Given an API that never accepts anything
    fake = FakeSetu(fail_rate=1.0)
    journal = await Journal(tmp_path / "p.log").open()
    async with client_for(fake) as client:
        producer = Producer(CONFIG, client, journal)
        tripped = fake.trip_after(10)
        task = asyncio.create_task(producer.run([]))
        await tripped.wait()
        # When the producer is told to stop
        producer.stop.set()
        finished = await asyncio.wait_for(task, 5)
    await journal.close()
    # Then it reports unfinished, each lane's first record sent but not acknowledged
    assert finished is False
    published = published_from_journal(read_entries(tmp_path / "p.log"))
    assert [(p.message_id.rsplit("-", 1)[1], p.acked) for p in published] == [("0", False)] * 3


async def test_pacer_keeps_the_rate_and_catches_up_after_a_stall() -> None:
    # Given a pacer at 100 calls/s that may catch up 0.1 s of schedule
    pacer = Pacer(100.0, catch_up_s=0.1)
    started = time.monotonic()
    for _ in range(10):
        await pacer.wait()
    # Then ten calls take about 0.1 s
    assert 0.08 <= time.monotonic() - started < 0.3
    # When the caller stalls for 0.5 s
    await asyncio.sleep(0.5)
    started = time.monotonic()
    for _ in range(10):
        await pacer.wait()
    # Then the first ten calls after it go out at once (0.1 s of schedule), no more
    assert time.monotonic() - started < 0.05
    started = time.monotonic()
    for _ in range(5):
        await pacer.wait()
    assert time.monotonic() - started >= 0.04
