"""The notifier's bookkeeping of the events' topics (delivery/events.py): what it commits,
and what a failed event becomes. Kafka and the endpoint are stand-ins here; the path through
real ones is tests/integration/delivery/test_events.py."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import orjson
import pytest
from confluent_kafka import Message, TopicPartition

from delivery import events
from delivery.events import H_CALLS, H_DUE, LoggedEvent, Notifier
from setu.clock import now_ms
from setu.model import Notifications
from setu.names import EVENTS_RETRY_TOPIC, EVENTS_TOPIC


class Endpoint:
    """Answers each call with the next status of ``statuses`` (the last one after that)."""

    def __init__(self, *statuses: int) -> None:
        self.statuses = list(statuses)
        self.calls: list[bytes] = []

    async def request(self, *args: Any) -> SimpleNamespace:
        self.calls.append(args[3])
        status = self.statuses.pop(0) if len(self.statuses) > 1 else self.statuses[0]
        return SimpleNamespace(status=status)


class RetryLog:
    """What the notifier wrote to the retry topic: (event id, calls, due)."""

    def __init__(self) -> None:
        self.written: list[tuple[str, int, int]] = []

    async def retry(self, event: LoggedEvent, calls: int, due_ms: int) -> None:
        assert event.event is not None
        self.written.append((event.event["id"], calls, due_ms))


def notifier(endpoint: Endpoint, retry_log: RetryLog) -> Notifier:
    async def configs() -> Sequence[Notifications]:
        wanted = Notifications("p", "https://ops.example.com/e", ("group.parked",))
        return [wanted]

    async def ready() -> bool:
        return True

    return Notifier({}, retry_log, ready, configs, endpoint)  # type: ignore[arg-type]


def record(topic: str, offset: int, event_id: str, partition: int = 0, **headers: int) -> Message:
    body = {"id": event_id, "type": "group.parked", "project": "p", "subscription": "s"}
    return Message(
        topic=topic,
        partition=partition,
        offset=offset,
        value=orjson.dumps({**body, "at_ms": 1, "data": {}}),
        headers=[(name, str(value).encode()) for name, value in headers.items()],
        error=None,
    )


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


async def test_a_failed_event_goes_to_the_retry_topic_and_its_offset_is_finished() -> None:
    # Given a notifier that owns the events' partition 0, and an endpoint failing once
    endpoint, retry_log = Endpoint(503, 200), RetryLog()
    sender = notifier(endpoint, retry_log)
    await sender.assigned([TopicPartition(EVENTS_TOPIC, 0, -1001)])
    # When it reads two events
    sender.on_batch([record(EVENTS_TOPIC, 7, "evt_a"), record(EVENTS_TOPIC, 8, "evt_b")])
    await settle()
    # Then the failed one is written to the retry topic, one call made, due after the first
    # back-off; the other was sent; and the partition is finished past both
    [(event_id, calls, due_ms)] = retry_log.written
    assert (event_id, calls) == ("evt_a", 1)
    assert due_ms - now_ms() == pytest.approx(events.FIRST_RETRY_MS, abs=1_000)
    assert len(endpoint.calls) == 2
    offsets = await sender.revoked([TopicPartition(EVENTS_TOPIC, 0)])
    assert [(o.topic, o.partition, o.offset) for o in offsets] == [(EVENTS_TOPIC, 0, 9)]


async def test_an_event_not_yet_due_holds_its_partitions_commit_until_it_is_sent() -> None:
    # Given a notifier that owns the retry topic's partition 0
    endpoint, retry_log = Endpoint(200), RetryLog()
    sender = notifier(endpoint, retry_log)
    await sender.assigned([TopicPartition(EVENTS_RETRY_TOPIC, 0, -1001)])
    # When it reads an event due in an hour (two calls made) and one already due
    later = {H_CALLS: 2, H_DUE: now_ms() + 3_600_000}
    sender.on_batch(
        [record(EVENTS_RETRY_TOPIC, 3, "evt_late", **later), record(EVENTS_RETRY_TOPIC, 4, "evt")]
    )
    await settle()
    # Then only the due one is called, and a takeover would read again from the held one
    assert [orjson.loads(body)["id"] for body in endpoint.calls] == ["evt"]
    offsets = await sender.revoked([TopicPartition(EVENTS_RETRY_TOPIC, 0)])
    assert [o.offset for o in offsets] == [3]


async def test_an_event_failing_its_last_call_is_dropped_not_tried_again() -> None:
    # Given an event that was called MAX_EVENT_ATTEMPTS - 1 times, and an endpoint still failing
    endpoint, retry_log = Endpoint(503), RetryLog()
    sender = notifier(endpoint, retry_log)
    await sender.assigned([TopicPartition(EVENTS_RETRY_TOPIC, 1, -1001)])
    calls = {H_CALLS: events.MAX_EVENT_ATTEMPTS - 1}
    sender.on_batch([record(EVENTS_RETRY_TOPIC, 0, "evt", partition=1, **calls)])
    await settle()
    # Then it is counted dropped, nothing goes to the retry topic, and its offset is finished
    assert (sender.counts.dropped, retry_log.written) == (1, [])
    offsets = await sender.revoked([TopicPartition(EVENTS_RETRY_TOPIC, 1)])
    assert [o.offset for o in offsets] == [1]
