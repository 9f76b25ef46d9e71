"""The operational events' stream in Redis (docs/policies.md §4): one stream,
:func:`state.keys.events_stream`, that every delivery worker appends to and whose consumer
group (one member per ``setu deliver`` process) sends each event to its project's endpoint.

An event is acknowledged only once it was sent (or wanted by nobody); a pending one is claimed
again by any member once its back-off has passed. The stream keeps about
:data:`STREAM_MAX_LEN` events, acknowledged or not. Redis errors reach the caller
(``delivery.events`` holds and retries).
"""

from __future__ import annotations

import contextlib
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

    async def append(self, events: Sequence[bytes]) -> None:
        """Appends each encoded event, in one round trip."""
        async with self._client.pipeline(transaction=False) as pipe:
            for raw in events:
                pipe.xadd(self._stream, {"e": raw}, maxlen=STREAM_MAX_LEN, approximate=True)
            await pipe.execute()

    async def join(self) -> None:
        """Makes the consumer group (from the stream's start) unless it exists."""
        with contextlib.suppress(ResponseError):  # BUSYGROUP: it exists
            await self._client.xgroup_create(self._stream, GROUP, id="0", mkstream=True)

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
