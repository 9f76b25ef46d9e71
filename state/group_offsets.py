"""Each subscription's offsets in its own consumer group, kept by a worker that never joins it
(decision 0011).

With one reader per worker and topic, a subscription's consumer group ``setu.sub.{p}.{s}``
has no members: it is where the subscription's progress is kept (offsets and their metadata,
docs/design.md §1), read at a takeover and written at each commit, so Kafka's own lag tools
still show it.

- Writing goes through the admin API (``AlterConsumerGroupOffsets``), which Kafka accepts for
  a group without members and refuses for one with members: a subscription still served by a
  worker of the earlier layout (its consumer in the group) cannot be written under it.
- Reading goes through a short-lived consumer in the group, which never subscribes: the admin
  API's ``ListConsumerGroupOffsets`` crashed the process (a segmentation fault in the client
  library) when asked right after a group's first write, on this machine's client 2.16.1.
  The library's handler of an OffsetFetch answer asks the client's consumer group to look
  for the coordinator again when the answer says it moved, and an admin client has none:
  still so in the library's newest source, and a moving coordinator is what a lost broker
  brings. Such a read costs the broker about 15 ms of CPU, so a subscription the API created
  and nobody owned since is not read at all (``born``, state/changelog.py).
- Whether a group has members is asked by listing the groups (:meth:`GroupOffsets.has_members`).

Each is a coroutine: writes and the membership check await admin clients' futures (the check
on a client of its own, so that a takeover never waits behind the commits); a read runs in a
thread, a few at a time.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from confluent_kafka import (
    ConsumerGroupState,
    ConsumerGroupTopicPartitions,
    KafkaException,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient

from setu.batching import Batched
from state.kafka_reader import committed_offsets

log = logging.getLogger(__name__)

# Committed offsets read at once (each with a thread and a short-lived consumer).
READ_CONCURRENCY = 3
# The admin client's own deadline for a group request, far above any outage. A group request
# first waits for the group's coordinator, with no deadline of its own; when the request's
# deadline passes during that wait (Kafka down), the client library frees the request and
# then, once Kafka is back, releases it a second time and aborts the process
# (`rd_kafka_enq_once_del_source_return` assertion, the library's open issue 4605; a crash
# run with 100 subscriptions saw workers abort so, decision 0011). The caller still gives
# up after its own ``timeout_s``; the request itself then completes when Kafka answers.
ADMIN_REQUEST_TIMEOUT_S = 600.0
# How long the takeovers asking whether groups have members wait for the groups' listing.
LIST_WAIT_S = 30.0
# Listed states of a group without members; any other (joining, rebalancing, stable, or one
# this client does not know) counts as members.
_WITHOUT_MEMBERS = {ConsumerGroupState.EMPTY, ConsumerGroupState.DEAD}


def _seen(future: asyncio.Future[Any]) -> None:
    """A request's answer that nobody waits for any more: its error is not an unseen one."""
    if not future.cancelled():
        future.exception()


class GroupNotEmpty(Exception):
    """The group has members (a worker of the earlier layout still serves it)."""


class GroupOffsets:
    def __init__(self, bootstrap: str, client_config: Mapping[str, str] | None = None) -> None:
        self._bootstrap = bootstrap
        self._client_config = dict(client_config or {})
        self._admin = AdminClient({"bootstrap.servers": bootstrap, **self._client_config})
        # The membership check of a takeover on a client of its own: on the commits' client
        # it waited behind a thousand subscriptions' commits after a burst (6.7 s for a new
        # subscription's first takeover, against none for the next one).
        self._membership = AdminClient({"bootstrap.servers": bootstrap, **self._client_config})
        self._reads = asyncio.Semaphore(READ_CONCURRENCY)
        self._members: Batched[str, bool] = Batched(self._listed)

    async def commit(
        self, group: str, offsets: Sequence[TopicPartition], timeout_s: float = 30.0
    ) -> None:
        """Writes ``offsets`` (with their metadata) as ``group``'s committed offsets. Raises
        GroupNotEmpty when the group has members, KafkaException on other failures. Awaits
        the admin client's own future: no thread waits on the broker meanwhile."""
        request = [ConsumerGroupTopicPartitions(group, list(offsets))]
        future = self._admin.alter_consumer_group_offsets(
            request, request_timeout=ADMIN_REQUEST_TIMEOUT_S
        )[group]
        try:
            result = await asyncio.wait_for(asyncio.wrap_future(future), timeout_s)
        except KafkaException as exc:
            if "UNKNOWN_MEMBER_ID" in str(exc) or "NON_EMPTY_GROUP" in str(exc):
                raise GroupNotEmpty(f"{group} has members") from exc
            raise
        failed = [tp for tp in result.topic_partitions or [] if tp.error is not None]
        if failed:
            codes = {str(tp.error) for tp in failed}
            if any("UNKNOWN_MEMBER_ID" in c or "NON_EMPTY_GROUP" in c for c in codes):
                raise GroupNotEmpty(f"{group} has members")
            raise KafkaException(failed[0].error)

    async def has_members(self, group: str, timeout_s: float = 30.0) -> bool:
        """Whether consumers are in ``group`` now (a worker of the earlier layout). Asked by
        listing the cluster's groups, once for every takeover that asks meanwhile
        (setu/batching.py): a group with members is listed with its state, and a
        subscription's group of this layout, which only ever holds offsets, is not listed or
        listed empty. Describing each group cost the broker 2 ms of CPU per group (two
        requests each: the client tries the newer protocol's describe first), 2,000 of them
        when two workers took over a thousand new subscriptions."""
        return await asyncio.wait_for(self._members.ask(group), timeout_s)

    async def _listed(self, groups: list[str]) -> dict[str, bool | BaseException]:
        future = self._membership.list_consumer_groups(request_timeout=ADMIN_REQUEST_TIMEOUT_S)
        waiting = asyncio.wrap_future(future)
        try:
            # Kafka away: this batch's callers are told after LIST_WAIT_S (theirs may be
            # shorter), and the next batch asks anew; this request ends when Kafka answers.
            listed = await asyncio.wait_for(asyncio.shield(waiting), LIST_WAIT_S)
        except TimeoutError:
            waiting.add_done_callback(_seen)
            raise TimeoutError("Kafka did not list its consumer groups in time") from None
        if listed.errors:
            # A broker did not answer (one lost, not yet fenced): the groups it coordinates
            # are not in the listing, so these are described one by one, as they used to be.
            log.info(
                "listing consumer groups: %s; describing %d instead", listed.errors[0], len(groups)
            )
            return await self._described(groups)
        busy = {g.group_id for g in listed.valid if g.state not in _WITHOUT_MEMBERS}
        return {group: group in busy for group in groups}

    async def _described(self, groups: list[str]) -> dict[str, bool | BaseException]:
        futures = self._membership.describe_consumer_groups(
            groups, request_timeout=ADMIN_REQUEST_TIMEOUT_S
        )
        waiting = [asyncio.wrap_future(futures[g]) for g in groups]
        done, _ = await asyncio.wait(waiting, timeout=LIST_WAIT_S)
        out: dict[str, bool | BaseException] = {}
        for group, future in zip(groups, waiting, strict=True):
            if future not in done:
                future.add_done_callback(_seen)
                out[group] = TimeoutError(f"{group}: Kafka did not describe it in time")
            elif (error := future.exception()) is not None:
                out[group] = error
            else:
                out[group] = bool(future.result().members)
        return out

    async def committed(
        self, group: str, partitions: Sequence[TopicPartition], timeout_s: float = 30.0
    ) -> list[TopicPartition]:
        """``group``'s committed offsets of ``partitions`` (offset < 0: none), with their
        metadata. Each read holds a thread and a short-lived consumer: at most
        ``READ_CONCURRENCY`` at once, so that a takeover of many subscriptions leaves the
        loop's threads to everything else."""
        async with self._reads:
            return await asyncio.to_thread(
                committed_offsets,
                self._bootstrap,
                self._client_config,
                group,
                list(partitions),
                time.monotonic() + timeout_s,
            )
