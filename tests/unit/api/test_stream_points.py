"""Where a stream stands (api/stream_server.py): the point of reference moves only over ids
that were all acknowledged, whatever order Kafka's reports come in, and stream names and
MESSAGE fields follow the rules of HTTP produce."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import pytest

from api.stream_server import PointTracker, check_message, parse_stream_name, record_points
from setu.errors import InvalidInput, PayloadTooLarge
from setu.stream import frames


def test_the_point_passes_only_ids_whose_every_predecessor_was_acknowledged() -> None:
    tracker = PointTracker(10)
    for sequence in (10, 11, 12, 15):
        tracker.sent(sequence)
    assert not tracker.acked(12)
    assert tracker.point == 10
    assert tracker.acked(10)
    assert tracker.point == 11
    assert tracker.acked(11)  # 12 came earlier: the point passes both
    assert tracker.point == 15
    assert len(tracker) == 1
    assert tracker.acked(15)
    assert tracker.point == 16 and len(tracker) == 0


def test_acknowledged_in_reverse_the_point_ends_past_the_last_id() -> None:
    tracker = PointTracker(0)
    for sequence in (28, 29):
        tracker.sent(sequence)
    tracker.acked(29)
    tracker.acked(28)
    assert tracker.point == 30


@pytest.mark.parametrize("seed", range(20))
def test_any_report_order_ends_one_past_the_highest_id(seed: int) -> None:
    shuffle = random.Random(seed)
    sent = sorted(shuffle.sample(range(1_000), 50))
    tracker = PointTracker(sent[0])
    for sequence in sent:
        tracker.sent(sequence)
    order = sent[:]
    shuffle.shuffle(order)
    done: set[int] = set()
    for sequence in order:
        tracker.acked(sequence)
        done.add(sequence)
        # Every id that went out below the point was acknowledged
        assert all(s in done for s in sent if s < tracker.point)
    assert tracker.point == sent[-1] + 1


@dataclass
class Stream:
    """What record_points reads of a session's stream."""

    tracker: PointTracker
    project: str = "shop"
    topic: str = "orders"
    producer: str = "p"
    incarnation: int = 1
    recorded: int = 0


@dataclass
class SlowStore:
    """Redis's stream points, answering only after ``during`` ran (a report arriving while
    the round trip is under way)."""

    during: list[Any] = field(default_factory=list)
    points: dict[str, tuple[int, int]] = field(default_factory=dict)

    async def record(self, project: str, topic: str, marks: Mapping[str, tuple[int, int]]) -> None:
        await asyncio.sleep(0)
        while self.during:
            self.during.pop(0)()
        for producer, mark in marks.items():
            self.points[producer] = max(self.points.get(producer, mark), mark)


async def test_a_point_that_moves_while_redis_answers_is_recorded_at_the_next_round() -> None:
    # Given a stream at point 3 whose report of id 3 arrives while the keeper records it
    tracker = PointTracker(0)
    for sequence in range(4):
        tracker.sent(sequence)
    for sequence in range(3):
        tracker.acked(sequence)
    stream = Stream(tracker)
    store = SlowStore(during=[lambda: tracker.acked(3)])
    await record_points([cast(Any, stream)], cast(Any, store))
    assert store.points == {"p": (1, 2)}
    # When the session ends and records its points again
    await record_points([cast(Any, stream)], cast(Any, store))
    # Then Redis holds the last id Kafka acknowledged, 3: a next session resumes at 4 and
    # the producer's resends of 3 are not written twice
    assert store.points == {"p": (1, 3)}


def test_stream_names_are_project_topic_producer() -> None:
    assert parse_stream_name(b"shop/orders/checkout-1") == ("shop", "orders", "checkout-1")
    for bad in (b"shop/orders", b"shop//p", b"a/b/c/d", b"\xff/b/c", b"s/t/" + b"x" * 101):
        with pytest.raises(InvalidInput):
            parse_stream_name(bad)


def message(key: bytes | None, payload: bytes = b"x", sequence: int = 1) -> frames.Message:
    flags = frames.KEY if key is not None else 0
    return frames.Message(1, flags, sequence, None, key, payload)


def test_a_message_is_checked_as_http_produce_checks_it() -> None:
    assert check_message(message(b"order-7"), True, 10) == ("order-7", b"x")
    assert check_message(message(None), False, 10) == (None, b"x")
    with pytest.raises(InvalidInput, match="X_GROUP_ID is required"):
        check_message(message(None), True, 10)
    with pytest.raises(InvalidInput, match="control characters"):
        check_message(message(b"a\nb"), True, 10)
    with pytest.raises(InvalidInput, match="UTF-8"):
        check_message(message(b"\xff"), True, 10)
    with pytest.raises(PayloadTooLarge):
        check_message(message(b"g", b"x" * 11), True, 10)
    with pytest.raises(InvalidInput, match="sequence id"):
        check_message(message(b"g", sequence=2**63), True, 10)
