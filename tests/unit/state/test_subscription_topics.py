"""Subscriptions' Kafka topics made in batches (state/subscription_topics.py)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from typing import Any

import pytest

from setu.errors import Conflict
from setu.model import Endpoint, Subscription, Topic
from state.subscription_topics import SubscriptionTopics


def sub(name: str) -> Subscription:
    return Subscription("p", name, "t", Endpoint("https://example.com/hook"))


class Kafka:
    """Records each batch; the first one waits until released."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self.release = threading.Event()

    def ensure_subscriptions(
        self, pairs: Sequence[tuple[Subscription, Topic]]
    ) -> dict[tuple[str, str], BaseException | None]:
        self.batches.append([s.name for s, _ in pairs])
        self.release.wait(10)
        return {
            (s.project, s.name): Conflict("other partitions") if s.name == "bad" else None
            for s, _ in pairs
        }


async def test_runners_starting_together_share_batches_and_each_hears_its_own_outcome() -> None:
    kafka = Kafka()
    looked_up: list[tuple[str, str]] = []

    def get_topic(project: str, name: str) -> Topic:
        looked_up.append((project, name))
        return Topic(project, name)

    topics = SubscriptionTopics(get_topic, kafka)  # type: ignore[arg-type]
    # Given one runner asking while Kafka is slow, and nine more asking meanwhile
    first = asyncio.ensure_future(topics.ensure(sub("s0")))
    await asyncio.sleep(0.1)
    rest: list[asyncio.Future[Any]] = [
        asyncio.ensure_future(topics.ensure(sub(n)))
        for n in ["bad", *(f"s{i}" for i in range(1, 9))]
    ]
    await asyncio.sleep(0.1)
    kafka.release.set()
    # Then the nine were made in one second batch, with one look-up of their topic
    await first
    outcomes = await asyncio.gather(*rest, return_exceptions=True)
    assert kafka.batches == [["s0"], ["bad", *(f"s{i}" for i in range(1, 9))]]
    assert looked_up == [("p", "t"), ("p", "t")]
    # And only the refused one fails, with Kafka's reason
    assert isinstance(outcomes[0], Conflict)
    assert outcomes[1:] == [None] * 8


async def test_a_store_that_is_away_fails_the_batch_and_the_next_ask_tries_again() -> None:
    kafka = Kafka()
    kafka.release.set()
    away = True

    def get_topic(project: str, name: str) -> Topic:
        if away:
            raise ConnectionError("the store is away")
        return Topic(project, name)

    topics = SubscriptionTopics(get_topic, kafka)  # type: ignore[arg-type]
    with pytest.raises(ConnectionError):
        await topics.ensure(sub("s"))
    away = False
    await topics.ensure(sub("s"))
    assert kafka.batches == [["s"]]


async def test_a_runner_s_start_does_not_wait_behind_tiers_being_made() -> None:
    class SlowTiers(Kafka):
        def ensure_states(
            self, pairs: Sequence[tuple[Subscription, Topic]]
        ) -> dict[tuple[str, str], BaseException | frozenset[str]]:
            return {(s.project, s.name): frozenset({"rq.1"}) for s, _ in pairs}

    kafka = SlowTiers()
    topics = SubscriptionTopics(lambda p, n: Topic(p, n), kafka)  # type: ignore[arg-type]
    # Given a first copy whose tiers Kafka is slow to make
    making = asyncio.ensure_future(topics.ensure(sub("failing")))
    await asyncio.sleep(0.1)
    # Then a runner starting meanwhile learns what it needs at once
    missing = await asyncio.wait_for(topics.ensure_state(sub("new")), 5)
    assert missing == frozenset({"rq.1"})
    assert not making.done()
    kafka.release.set()
    await making
