"""Making a new subscription's Kafka topic after its create has been answered.

A subscription's retry tiers, DLQ and changelog used to be made inside the create request,
which then took 150 ms on an idle broker and over a second with a hundred subscriptions
being served. The answer now waits only for the metadata row (docs/delivery.md, "A new
subscription"): the API starts making the topics at once, in the background and in batches
with those of other subscriptions created meanwhile (state/subscription_topics.py), and every
delivery worker makes sure they exist before it runs the subscription (``prepare`` of its
runner), so a create whose background work failed or was cut short by a restart loses
nothing: the topics are made before any message could go to them. Only its group-state
changelog is made here: its retry tiers and DLQ wait for its first copy there
(docs/decisions/0014-no-topics-until-a-failure.md).

Once the changelog exists, a subscription just created gets a ``born`` record in each of its
partitions (state/changelog.py): a worker taking it over then knows its consumer group holds
no offsets without asking Kafka, a short-lived consumer's work per subscription, which at a
thousand new subscriptions was most of what the broker did. Written only for a create that
made the row (never for a retry that found it), and never needed: without it a worker asks.

One task per subscription and process. A delete waits for the subscription's task, so it
never races topics being made for the subscription it removes; shutdown waits for all of
them, within a bound.
"""

from __future__ import annotations

import asyncio
import logging

from setu import names
from setu.model import Subscription
from state.changelog import Send, born_record
from state.shared_changelog import shared_key
from state.subscription_topics import SubscriptionTopics

log = logging.getLogger(__name__)

CLOSE_TIMEOUT_S = 15.0


class Provisioning:
    """The background tasks that make subscriptions' Kafka topics (see the module doc)."""

    def __init__(self, topics: SubscriptionTopics, send: Send | None = None) -> None:
        """``send(topic, partition, records)``: writes to a changelog partition (None: no
        ``born`` records)."""
        self._topics = topics
        self._send = send
        self._tasks: dict[tuple[str, str], asyncio.Task[None]] = {}

    def start(self, sub: Subscription, born_partitions: int = 0) -> None:
        """Starts making ``sub``'s topics unless that is under way already; with
        ``born_partitions`` (its topic's partition count: it was just created), then writes its
        ``born`` records."""
        key = (sub.project, sub.name)
        if key in self._tasks:
            return
        task = asyncio.get_running_loop().create_task(self._make(sub, born_partitions))
        self._tasks[key] = task
        task.add_done_callback(lambda _: self._tasks.pop(key, None))

    async def _make(self, sub: Subscription, born_partitions: int) -> None:
        try:
            await self._topics.ensure_state(sub)
        except Exception as exc:  # the workers make them before they run it
            log.warning(
                "subscription %s/%s: its Kafka topics were not made in the background (%s); "
                "a delivery worker makes them before it runs the subscription",
                sub.project,
                sub.name,
                exc,
            )
            return
        if not born_partitions or self._send is None:
            return
        try:
            await self._born(sub, born_partitions)
        except Exception as exc:  # a worker then asks Kafka for the group's offsets
            log.warning(
                "subscription %s/%s: its born records were not written (%s); a worker taking "
                "it over asks Kafka for its offsets",
                sub.project,
                sub.name,
                exc,
            )

    async def _born(self, sub: Subscription, partitions: int) -> None:
        assert self._send is not None
        record = born_record()
        keyed = [(shared_key(sub.name, record.key), record.value, record.headers())]
        topic = names.groups_topic(sub.project, sub.topic)
        await asyncio.gather(*(self._send(topic, p, keyed) for p in range(partitions)))

    async def settled(self, project: str, name: str) -> None:
        """Returns once no task of this process is making the subscription's topics."""
        task = self._tasks.get((project, name))
        if task is not None:
            await asyncio.shield(task)

    async def close(self) -> None:
        """Waits for the tasks under way (at most ``CLOSE_TIMEOUT_S``)."""
        tasks = list(self._tasks.values())
        if tasks:
            await asyncio.wait(tasks, timeout=CLOSE_TIMEOUT_S)
