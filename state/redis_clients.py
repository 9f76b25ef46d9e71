"""How every Setu process connects to Redis: the server ``SETU_REDIS_URL`` names, or the
primary that a group of Sentinels names (``SETU_REDIS_SENTINELS``), asked again after every
failed connection, so a failover moves every client to the promoted replica by itself.

A replica promoted by Sentinel may lack its old primary's last writes (replication is
asynchronous): Setu keeps nothing in Redis that it cannot rebuild (docs/design.md §4).

An asyncio client holds at most ``SETU_REDIS_MAX_CONNECTIONS`` connections; a command that
finds them all busy waits for one (up to ``POOL_WAIT_S``) instead of failing at once, which is
what redis-py's default pool does past its 100: a worker serving a hundred subscriptions asked
for more at a takeover, and every refused command stopped a subscription.
"""

from __future__ import annotations

from typing import Any

import redis
import redis.asyncio
import redis.asyncio.sentinel
import redis.sentinel
from redis.connection import parse_url

from setu.settings import Settings


def sentinel_addresses(text: str) -> list[tuple[str, int]]:
    """``"host:port,host:port"`` as pairs; raises ValueError naming a bad entry."""
    out = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        host, _, port = item.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"SETU_REDIS_SENTINELS: {item!r} is not host:port")
        out.append((host.strip("[]"), int(port)))
    if not out:
        raise ValueError("SETU_REDIS_SENTINELS names no Sentinel")
    return out


def primary_options(url: str) -> dict[str, Any]:
    """What ``url`` says of connections besides where to connect: database, credentials,
    TLS and its options (a primary found through Sentinel has its own address)."""
    options = parse_url(url)
    for where in ("host", "port", "path", "connection_class"):
        options.pop(where, None)
    if url.startswith("rediss://"):
        options["ssl"] = True
    return options


def _sentinel_kwargs(settings: Settings, timeouts: dict[str, Any]) -> dict[str, Any]:
    kwargs = dict(timeouts)
    if settings.redis_sentinel_password is not None:
        kwargs["password"] = settings.redis_sentinel_password.get_secret_value()
    return kwargs


# How long a command waits for a free connection of its client's pool before it fails.
POOL_WAIT_S = 20.0


class _BlockingSentinelPool(
    redis.asyncio.sentinel.SentinelConnectionPool,  # type: ignore[type-arg]
    redis.asyncio.BlockingConnectionPool,  # type: ignore[type-arg]
):
    """The Sentinel-named primary's pool, waiting for a free connection as
    ``BlockingConnectionPool`` does (the Sentinel pool only finds the address)."""


def async_redis(
    settings: Settings, url: str, max_connections: int | None = None, **timeouts: Any
) -> redis.asyncio.Redis[bytes]:
    """An asyncio client of the Redis (or Sentinel-named primary) of ``settings``, whose
    commands wait for a connection when all of its pool's are busy (module doc), holding at
    most ``max_connections`` of them (None: ``SETU_REDIS_MAX_CONNECTIONS``)."""
    pool = {
        "max_connections": max_connections or settings.redis_max_connections,
        "timeout": POOL_WAIT_S,
    }
    if not settings.redis_sentinels:
        blocking: Any = redis.asyncio.BlockingConnectionPool.from_url(url, **pool, **timeouts)
        # The client owns the pool, and closes it with itself. (types-redis predates from_pool.)
        plain: redis.asyncio.Redis[bytes] = redis.asyncio.Redis.from_pool(blocking)  # type: ignore[attr-defined]
        return plain
    sentinel = redis.asyncio.sentinel.Sentinel(
        sentinel_addresses(settings.redis_sentinels),
        sentinel_kwargs=_sentinel_kwargs(settings, timeouts),
        **timeouts,
    )
    client: redis.asyncio.Redis[bytes] = sentinel.master_for(
        settings.redis_sentinel_master,
        connection_pool_class=_BlockingSentinelPool,
        **pool,
        **primary_options(url),
    )
    return client


def sync_redis(settings: Settings, url: str, **timeouts: Any) -> redis.Redis[bytes]:
    """A blocking client of the Redis (or Sentinel-named primary) of ``settings``."""
    if not settings.redis_sentinels:
        return redis.Redis.from_url(url, **timeouts)
    sentinel = redis.sentinel.Sentinel(
        sentinel_addresses(settings.redis_sentinels),
        sentinel_kwargs=_sentinel_kwargs(settings, timeouts),
        **timeouts,
    )
    client: redis.Redis[bytes] = sentinel.master_for(
        settings.redis_sentinel_master, **primary_options(url)
    )
    return client


async def close(client: redis.asyncio.Redis[bytes]) -> None:
    """Closes an asyncio client and its connections (a process's last step)."""
    await client.aclose()  # type: ignore[attr-defined]  # types-redis predates aclose
