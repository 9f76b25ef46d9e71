"""The operational events' stream in Redis (docs/policies.md §4): one stream,
:func:`state.keys.events_stream`, that every delivery worker appends to and whose consumer
group (one member per ``setu deliver`` process) sends each event to its project's endpoint.

An event is acknowledged only once it was sent (or wanted by nobody); a pending one is claimed
again by any member once its back-off has passed. The stream keeps about
:data:`STREAM_MAX_LEN` events, acknowledged or not. Redis errors reach the caller
(``delivery.events`` holds and retries).

Redis may forget the stream (a flush, a failover to a replica that had not caught up). A
*generation* key, set once per stream, tells each member when that happened: :meth:`join`
answers whether the generation changed since this member last joined, so a notifier can write
again the events it had not finished (docs/policies.md §4).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from state import keys

STREAM_MAX_LEN = 100_000
GROUP = "notifier"

Fields = dict[bytes, bytes]


class RedisEventStream:
    def __init__(self, client: Redis[bytes]) -> None:
        self._client = client
        self._stream = keys.events_stream()
        self._generation_key = keys.events_generation()
        self._generation: bytes | None = None

    async def append(self, events: Sequence[bytes]) -> None:
        """Appends each encoded event, in one round trip."""
        async with self._client.pipeline(transaction=False) as pipe:
            for raw in events:
                pipe.xadd(self._stream, {"e": raw}, maxlen=STREAM_MAX_LEN, approximate=True)
            await pipe.execute()

    async def join(self) -> bool:
        """Makes the consumer group (from the stream's start) unless it exists, in one round
        trip. True when Redis forgot the stream since this member's previous join: the events
        that were pending in it are gone."""
        async with self._client.pipeline(transaction=False) as pipe:
            pipe.xgroup_create(self._stream, GROUP, id="0", mkstream=True)
            pipe.set(self._generation_key, uuid.uuid4().hex, nx=True)
            pipe.get(self._generation_key)
            made, _, generation = await pipe.execute(raise_on_error=False)
        if isinstance(made, ResponseError) and "BUSYGROUP" not in str(made):
            raise made
        if isinstance(generation, Exception):
            raise generation
        forgotten = self._generation is not None and generation != self._generation
        self._generation = generation
        return forgotten

    async def read_new(
        self, consumer: str, count: int, block_ms: int
    ) -> list[tuple[bytes, Fields | None]]:
        """Up to ``count`` events no member has read yet, waiting up to ``block_ms``."""
        answer = await self._client.xreadgroup(
            GROUP, consumer, {self._stream: ">"}, count=count, block=block_ms
        )
        return [entry for _, entries in answer or () for entry in entries]

    async def claim_due(
        self, consumer: str, idle_ms: int, wait_ms: Callable[[int], int], count: int = 100
    ) -> list[tuple[bytes, Fields | None, int]]:
        """Pending events idle at least ``idle_ms`` whose back-off ``wait_ms(deliveries)``
        has passed, claimed for ``consumer``: (id, fields, deliveries so far)."""
        pending = await self._client.xpending_range(
            self._stream, GROUP, min="-", max="+", count=count, idle=idle_ms
        )
        due = [
            (p["message_id"], int(p["times_delivered"]))
            for p in pending
            if int(p["time_since_delivered"]) >= wait_ms(int(p["times_delivered"]))
        ]
        out = []
        for message_id, deliveries in due:
            claimed = await self._client.xclaim(  # type: ignore[no-untyped-call]
                self._stream, GROUP, consumer, wait_ms(deliveries), [message_id]
            )
            out += [(entry_id, fields, deliveries) for entry_id, fields in claimed]
        return out

    async def ack(self, entry_id: bytes) -> None:
        await self._client.xack(self._stream, GROUP, entry_id)  # type: ignore[no-untyped-call]
