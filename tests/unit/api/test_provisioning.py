"""The background making of a new subscription's Kafka topics (api/provisioning.py)."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Sequence

import pytest

from api.provisioning import Provisioning
from setu.model import Endpoint, Subscription, Topic
from state.subscription_topics import SubscriptionTopics

SUB = Subscription("p", "s", "t", Endpoint("https://example.com/hook"))
Outcomes = dict[tuple[str, str], BaseException | None]


class Kafka:
    def __init__(self, error: BaseException | None = None) -> None:
        self.release = threading.Event()
        self.batches: list[list[str]] = []
        self.error = error

    def ensure_subscriptions(self, pairs: Sequence[tuple[Subscription, Topic]]) -> Outcomes:
        self.batches.append([s.name for s, _ in pairs])
        self.release.wait(10)
        return {(s.project, s.name): self.error for s, _ in pairs}

    def ensure_states(
        self, pairs: Sequence[tuple[Subscription, Topic]]
    ) -> dict[tuple[str, str], BaseException | frozenset[str]]:
        made = self.ensure_subscriptions(pairs)
        return {key: error or frozenset() for key, error in made.items()}


def provisioning(kafka: Kafka) -> Provisioning:
    return Provisioning(SubscriptionTopics(Topic, kafka))  # type: ignore[arg-type]


async def test_a_delete_waits_for_the_topics_being_made_and_one_make_runs_at_a_time() -> None:
    kafka = Kafka()
    made = provisioning(kafka)
    made.start(SUB)
    made.start(SUB)  # a repeated create while the first is under way
    waiting = asyncio.ensure_future(made.settled("p", "s"))
    await asyncio.sleep(0.2)
    assert not waiting.done()  # the delete would remove topics still being made
    kafka.release.set()
    await asyncio.wait_for(waiting, 5)
    assert kafka.batches == [["s"]]
    await made.settled("p", "other")  # nothing under way: returns at once


async def test_a_failed_make_is_logged_and_left_to_the_workers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    kafka = Kafka(RuntimeError("Kafka did not answer"))
    kafka.release.set()
    made = provisioning(kafka)
    with caplog.at_level(logging.WARNING):
        made.start(SUB)
        await made.settled("p", "s")
        await made.close()
    assert "p/s: its Kafka topics were not made in the background (Kafka did not answer)" in (
        caplog.text
    )
