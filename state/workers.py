"""What delivery workers tell the rest of Setu through Redis: that they are alive (a heartbeat
key with a TTL, which ``setu deliver --check`` probes) and, per subscription they run, their
live figures (one hash field per worker, which the status view sums over the fresh ones).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson
import redis
from redis.asyncio import Redis

from state import keys

# A worker's figures older than this are not counted (it reports every 2 s; an older
# report is of a worker gone or stalled).
STATS_FRESH_MS = 10_000


async def beat(client: Redis[bytes], worker_id: str, ttl_ms: int) -> None:
    await client.set(keys.worker_heartbeat(worker_id), b"alive", px=ttl_ms)


async def stop_beating(client: Redis[bytes], worker_id: str) -> None:
    await client.delete(keys.worker_heartbeat(worker_id))


def is_alive(client: redis.Redis[bytes], worker_id: str) -> bool:
    """Whether the worker's heartbeat lives (raises redis errors)."""
    return bool(client.exists(keys.worker_heartbeat(worker_id)))


async def report(
    client: Redis[bytes],
    project: str,
    subscription: str,
    worker_id: str,
    figures: Mapping[str, Any],
) -> None:
    """The worker's figures for one subscription, with ``at`` (epoch ms) among them."""
    await client.hset(keys.worker_stats(project, subscription), worker_id, orjson.dumps(figures))


async def forget(client: Redis[bytes], project: str, subscription: str, worker_id: str) -> None:
    await client.hdel(keys.worker_stats(project, subscription), worker_id)


async def fresh_reports(
    client: Redis[bytes], project: str, subscription: str, now_ms: int
) -> list[dict[str, Any]]:
    """The figures of the workers that reported within :data:`STATS_FRESH_MS`."""
    raw = await client.hvals(keys.worker_stats(project, subscription))
    reports = [orjson.loads(r) for r in raw]
    return [r for r in reports if now_ms - r.get("at", 0) < STATS_FRESH_MS]
