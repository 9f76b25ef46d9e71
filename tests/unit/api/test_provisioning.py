"""The background making of a new subscription's Kafka topics (api/provisioning.py)."""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest

from api.provisioning import Provisioning
from setu.model import Endpoint, Subscription, Topic

SUB = Subscription("p", "s", "t", Endpoint("https://example.com/hook"))
TOPIC = Topic("p", "t")


async def test_a_delete_waits_for_the_topics_being_made_and_one_make_runs_at_a_time() -> None:
    release = threading.Event()
    calls: list[str] = []

    def ensure(sub: Subscription, topic: Topic) -> None:
        calls.append(sub.name)
        release.wait(10)

    made = Provisioning(ensure)
    made.start(SUB, TOPIC)
    made.start(SUB, TOPIC)  # a repeated create while the first is under way
    waiting = asyncio.ensure_future(made.settled("p", "s"))
    await asyncio.sleep(0.2)
    assert not waiting.done()  # the delete would remove topics still being made
    release.set()
    await asyncio.wait_for(waiting, 5)
    assert calls == ["s"]
    await made.settled("p", "other")  # nothing under way: returns at once


async def test_a_failed_make_is_logged_and_left_to_the_workers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def ensure(sub: Subscription, topic: Topic) -> None:
        raise RuntimeError("Kafka did not answer")

    made = Provisioning(ensure)
    with caplog.at_level(logging.WARNING):
        made.start(SUB, TOPIC)
        await made.settled("p", "s")
        await made.close()
    assert "p/s: its Kafka topics were not made in the background (Kafka did not answer)" in (
        caplog.text
    )
