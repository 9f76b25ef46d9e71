"""What delivery workers tell the rest of Setu: that they are alive (a heartbeat with a TTL,
which ``setu deliver --check`` probes) and, per subscription they run, their live figures (one
record per worker, which the status view sums over the fresh ones).

Contract (:class:`RedisWorkers` and :class:`StubWorkers`, the same tests on both): a report
replaces the worker's previous one for that subscription; :meth:`WorkerReports.fresh` returns
the reports whose ``at`` (epoch ms) is within :data:`STATS_FRESH_MS` of ``now_ms``; a
forgotten worker's report is gone; a heartbeat lives for its TTL unless stopped.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import orjson
import redis
from redis.asyncio import Redis

from state import keys

# A worker's figures older than this are not counted (it reports every 2 s; an older
# report is of a worker gone or stalled).
STATS_FRESH_MS = 10_000
# A stop's confirmations are kept a day after the last one.
STOP_CONFIRMATION_TTL_MS = 24 * 3600 * 1000


class WorkerReports(Protocol):
    async def beat(self, worker_id: str, ttl_ms: int) -> None: ...

    async def stop_beating(self, worker_id: str) -> None: ...

    async def report(
        self, project: str, subscription: str, worker_id: str, figures: Mapping[str, Any]
    ) -> None:
        """The worker's figures for one subscription, ``at`` (epoch ms) among them."""

    async def forget(self, project: str, subscription: str, worker_id: str) -> None: ...

    async def fresh(self, project: str, subscription: str, now_ms: int) -> list[dict[str, Any]]:
        """The figures of the workers that reported within :data:`STATS_FRESH_MS`."""
        ...

    async def fresh_by_worker(
        self, project: str, subscription: str, now_ms: int
    ) -> dict[str, dict[str, Any]]:
        """:meth:`fresh`, by worker id."""
        ...

    async def confirm_stop(
        self, project: str, subscription: str, worker_id: str, record: Mapping[str, Any]
    ) -> None:
        """The worker stopped running the subscription (docs/policies.md §6)."""

    async def stop_confirmations(
        self, project: str, subscription: str
    ) -> dict[str, dict[str, Any]]: ...


class RedisWorkers:
    """Heartbeats as keys with a TTL, figures as one hash per subscription."""

    def __init__(self, client: Redis[bytes]) -> None:
        self._client = client

    async def beat(self, worker_id: str, ttl_ms: int) -> None:
        await self._client.set(keys.worker_heartbeat(worker_id), b"alive", px=ttl_ms)

    async def stop_beating(self, worker_id: str) -> None:
        await self._client.delete(keys.worker_heartbeat(worker_id))

    async def report(
        self, project: str, subscription: str, worker_id: str, figures: Mapping[str, Any]
    ) -> None:
        key = keys.worker_stats(project, subscription)
        await self._client.hset(key, worker_id, orjson.dumps(figures))

    async def forget(self, project: str, subscription: str, worker_id: str) -> None:
        await self._client.hdel(keys.worker_stats(project, subscription), worker_id)

    async def fresh(self, project: str, subscription: str, now_ms: int) -> list[dict[str, Any]]:
        return list((await self.fresh_by_worker(project, subscription, now_ms)).values())

    async def fresh_by_worker(
        self, project: str, subscription: str, now_ms: int
    ) -> dict[str, dict[str, Any]]:
        raw = await self._client.hgetall(keys.worker_stats(project, subscription))
        return _fresh_by_worker({k.decode(): orjson.loads(v) for k, v in raw.items()}, now_ms)

    async def confirm_stop(
        self, project: str, subscription: str, worker_id: str, record: Mapping[str, Any]
    ) -> None:
        key = keys.stop_confirmations(project, subscription)
        async with self._client.pipeline(transaction=True) as pipe:
            pipe.hset(key, worker_id, orjson.dumps(record))
            pipe.pexpire(key, STOP_CONFIRMATION_TTL_MS)
            await pipe.execute()

    async def stop_confirmations(
        self, project: str, subscription: str
    ) -> dict[str, dict[str, Any]]:
        raw = await self._client.hgetall(keys.stop_confirmations(project, subscription))
        return {k.decode(): orjson.loads(v) for k, v in raw.items()}


class StubWorkers:
    """In memory; time is what the caller says it is."""

    def __init__(self) -> None:
        self.beats: dict[str, int] = {}  # worker -> ttl_ms
        self.reports: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
        self.stops: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}

    async def beat(self, worker_id: str, ttl_ms: int) -> None:
        self.beats[worker_id] = ttl_ms

    async def stop_beating(self, worker_id: str) -> None:
        self.beats.pop(worker_id, None)

    async def report(
        self, project: str, subscription: str, worker_id: str, figures: Mapping[str, Any]
    ) -> None:
        self.reports.setdefault((project, subscription), {})[worker_id] = dict(figures)

    async def forget(self, project: str, subscription: str, worker_id: str) -> None:
        self.reports.get((project, subscription), {}).pop(worker_id, None)

    async def fresh(self, project: str, subscription: str, now_ms: int) -> list[dict[str, Any]]:
        return list((await self.fresh_by_worker(project, subscription, now_ms)).values())

    async def fresh_by_worker(
        self, project: str, subscription: str, now_ms: int
    ) -> dict[str, dict[str, Any]]:
        return _fresh_by_worker(dict(self.reports.get((project, subscription), {})), now_ms)

    async def confirm_stop(
        self, project: str, subscription: str, worker_id: str, record: Mapping[str, Any]
    ) -> None:
        self.stops.setdefault((project, subscription), {})[worker_id] = dict(record)

    async def stop_confirmations(
        self, project: str, subscription: str
    ) -> dict[str, dict[str, Any]]:
        return dict(self.stops.get((project, subscription), {}))


def _fresh_by_worker(reports: dict[str, dict[str, Any]], now_ms: int) -> dict[str, dict[str, Any]]:
    return {w: r for w, r in reports.items() if now_ms - r.get("at", 0) < STATS_FRESH_MS}


def is_alive(client: redis.Redis[bytes], worker_id: str) -> bool:
    """Whether the worker's heartbeat lives (the CLI probe, synchronous; raises redis errors)."""
    return bool(client.exists(keys.worker_heartbeat(worker_id)))
