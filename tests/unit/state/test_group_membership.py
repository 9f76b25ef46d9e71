"""Whether groups have members, asked by listing the cluster's groups; a listing a broker did
not answer falls back to describing the groups asked (state/group_offsets.py)."""

from __future__ import annotations

import asyncio
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import ConsumerGroupState, KafkaError, KafkaException

from state.group_offsets import GroupOffsets


@dataclass
class Listing:
    group_id: str
    state: ConsumerGroupState


@dataclass
class Listed:
    valid: list[Listing]
    errors: list[KafkaException] = field(default_factory=list)


@dataclass
class Description:
    members: list[str]


class FakeAdmin:
    def __init__(self, listed: Listed, members: dict[str, list[str]]) -> None:
        self.listed = listed
        self.members = members
        self.lists = 0
        self.described: list[list[str]] = []

    def list_consumer_groups(self, **_: Any) -> Future[Listed]:
        self.lists += 1
        future: Future[Listed] = Future()
        future.set_result(self.listed)
        return future

    def describe_consumer_groups(self, groups: list[str], **_: Any) -> dict[str, Future[Any]]:
        self.described.append(list(groups))
        out: dict[str, Future[Any]] = {}
        for g in groups:
            out[g] = Future()
            out[g].set_result(Description(self.members.get(g, [])))
        return out


def offsets_with(admin: FakeAdmin) -> GroupOffsets:
    offsets = GroupOffsets("127.0.0.1:1")
    offsets._membership = admin  # type: ignore[assignment]
    return offsets


def test_groups_asked_together_are_answered_by_one_listing() -> None:
    async def scenario() -> None:
        listed = Listed(
            [
                Listing("served", ConsumerGroupState.STABLE),
                Listing("joining", ConsumerGroupState.PREPARING_REBALANCING),
                Listing("left", ConsumerGroupState.EMPTY),
            ]
        )
        admin = FakeAdmin(listed, {})
        offsets = offsets_with(admin)
        asked = ["served", "joining", "left", "offsets-only"]
        answers = await asyncio.gather(*(offsets.has_members(g) for g in asked))
        assert answers == [True, True, False, False]
        assert admin.lists == 1 and admin.described == []

    asyncio.run(scenario())


def test_a_listing_a_broker_did_not_answer_describes_the_groups_instead() -> None:
    async def scenario() -> None:
        # A lost broker coordinates "served": the listing lacks it and says so
        away = KafkaException(KafkaError(KafkaError._TRANSPORT, "broker 2 is away"))
        admin = FakeAdmin(Listed([], [away]), {"served": ["worker-1"]})
        offsets = offsets_with(admin)
        answers = await asyncio.gather(*(offsets.has_members(g) for g in ["served", "other"]))
        assert answers == [True, False]
        assert admin.described == [["served", "other"]]

    asyncio.run(scenario())
