"""Subscriptions' own Kafka topics (retry tiers, DLQ, changelog) made where missing, in
batches (docs/delivery.md, "A new subscription").

Two callers ask for many at once: the API, which makes a subscription's topics right after
answering its create (a client creating a hundred subscriptions asks a hundred times in a
few seconds), and a delivery worker, whose runners each ask before they read anything (a
worker that starts, or hears of a hundred new subscriptions, starts a hundred runners in the
same moment). Asked one by one, each costs a few Kafka requests in a shared thread pool, and
the broker commits each create request on its own: measured on this project's test broker,
50 subscriptions took 6.3 s one by one and 0.8 s in one batch. Here the asks that arrive
while one batch is under way wait for the next, and each batch is one thread's work: one
request to learn which topics exist, one to make the missing ones of every subscription, one
to set the DLQs' retention (``KafkaTopics.ensure_subscriptions``).

A subscription's retry tiers and DLQ are made at its first copy there, not at its start
(docs/decisions/0014-no-topics-until-a-failure.md): :meth:`SubscriptionTopics.ensure_state`
makes only its group-state changelog and answers which of its tiers and DLQ are missing, in
the same batches; :meth:`SubscriptionTopics.ensure` makes everything.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

from setu.batching import Batched
from setu.model import Subscription, Topic
from state.kafka_admin import KafkaTopics

Key = tuple[str, str]


class SubscriptionTopics:
    """Makes subscriptions' own Kafka topics in batches (see the module doc)."""

    def __init__(self, get_topic: Callable[[str, str], Topic], topics: KafkaTopics) -> None:
        self._get_topic = get_topic  # blocking: the metadata store
        self._topics = topics
        # One queue per kind, each drained on its own: a runner's start asks only for its
        # changelog and must not wait behind the tiers of a thousand subscriptions failing at
        # once, which Kafka may take minutes to make (decision 0014).
        self._batches: dict[bool, Batched[Key, Any]] = {
            kind: Batched(partial(self._made, kind)) for kind in (False, True)
        }
        # Per kind, the subscription asked under each key, until its batch takes it.
        self._asking: dict[bool, dict[Key, Subscription]] = {False: {}, True: {}}

    async def ensure(self, sub: Subscription) -> None:
        """Returns once ``sub``'s tiers, DLQ and changelog exist; raises what stopped that."""
        await self._ask(sub, state_only=False)

    async def ensure_state(self, sub: Subscription) -> frozenset[str]:
        """Returns once ``sub``'s changelog exists, with the names of its retry tiers and DLQ
        that do not exist; raises what stopped that."""
        missing: frozenset[str] = await self._ask(sub, state_only=True)
        return missing

    async def _ask(self, sub: Subscription, *, state_only: bool) -> Any:
        key = (sub.project, sub.name)
        self._asking[state_only][key] = sub
        return await self._batches[state_only].ask(key)

    async def _made(
        self, state_only: bool, keys: list[Key]
    ) -> Mapping[Key, BaseException | frozenset[str] | None]:
        asked = self._asking[state_only]
        subs = [asked.pop(k) for k in keys if k in asked]
        # Each batch is one thread's work (the store and Kafka's admin client block); the
        # store or Kafka away fails the batch, and each runner asks again.
        return await asyncio.to_thread(self._make, subs, state_only)

    def _make(
        self, subs: Sequence[Subscription], state_only: bool
    ) -> Mapping[Key, BaseException | frozenset[str] | None]:
        out: dict[Key, BaseException | frozenset[str] | None] = {}
        shapes: dict[Key, Topic] = {}
        pairs = []
        for sub in subs:
            try:
                topic = shapes.get((sub.project, sub.topic))
                if topic is None:
                    topic = shapes[(sub.project, sub.topic)] = self._get_topic(
                        sub.project, sub.topic
                    )
            except Exception as exc:
                out[(sub.project, sub.name)] = exc
                continue
            pairs.append((sub, topic))
        if pairs:
            if state_only:
                out.update(self._topics.ensure_states(pairs))
            else:
                out.update(self._topics.ensure_subscriptions(pairs))
        return out
