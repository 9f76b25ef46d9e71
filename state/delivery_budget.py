"""A subscription's call budget shared by every worker running it (docs/policies.md §5), in
Redis, so that ``max_in_flight`` and ``rate_limit_per_second`` hold for the subscription as a
whole, not per worker.

- *Slots* (``max_in_flight``): each worker says, every quarter second or so, how many calls it
  wants to have going (its demand) and how many it has going (busy). One script shares the
  limit out max-min fairly over the demands of the workers that spoke within the last few
  seconds, and never grants more than the others leave: a worker's holding counts as the larger
  of its grant and its busy calls, so a shrinking grant is not handed to another worker before
  its calls finished. A worker that stops speaking (crashed) loses its holding when its entry
  expires.
- *Rate* (``rate_limit_per_second``): a token bucket, the produce quota's script
  (state/quota_buckets.py) on the subscription's own key; a worker leases a few calls' worth
  at a time.

Times come from the Redis server's clock, so workers' clocks do not matter.

The same object carries the circuit-breaker facts workers share (docs/policies.md §2): that
some worker found the endpoint down (a key with the open breaker's view and a TTL, refreshed
while it stays open), so the others stop calling within a second instead of each spending its
own ``min_calls`` failed attempts first; and that a probe found it up again (the same key,
saying ``closed``, for a few seconds).
"""

from __future__ import annotations

from typing import Any, Protocol

import orjson
from redis.asyncio import Redis

from state import keys
from state.quota_buckets import Grant, RedisTokenBuckets

# How long a worker's slot entry counts after it last spoke; an idle worker's entry (no demand,
# no call going, only the headroom asked for) lasts longer, so it speaks less often: a crashed
# idle worker holds its few headroom slots from the others up to that long.
SLOT_ENTRY_TTL_MS = 3_000
SLOT_IDLE_TTL_MS = 10_000

# KEYS: the subscription's slot hash (field: worker, value "demand,held,expires_ms").
# ARGV: worker, demand, busy, limit, ttl_ms. Returns the worker's grant.
_SHARE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local me = ARGV[1]
local demand, busy = tonumber(ARGV[2]), tonumber(ARGV[3])
local limit, ttl = tonumber(ARGV[4]), tonumber(ARGV[5])
local all = redis.call('HGETALL', KEYS[1])
local demands = {demand}
local held_by_others = 0
for i = 1, #all, 2 do
  if all[i] ~= me then
    local d, h, e = string.match(all[i + 1], '^(%d+),(%d+),(%d+)$')
    if d == nil or tonumber(e) < now then
      redis.call('HDEL', KEYS[1], all[i])
    else
      table.insert(demands, tonumber(d))
      held_by_others = held_by_others + tonumber(h)
    end
  end
end
table.sort(demands)
local left, remaining, level = limit, #demands, limit
for _, d in ipairs(demands) do
  local even = math.floor(left / remaining)
  if d <= even then
    left = left - d
    remaining = remaining - 1
  else
    level = even
    break
  end
end
local grant = math.min(demand, level, limit - held_by_others)
if grant < 0 then grant = 0 end
redis.call('HSET', KEYS[1], me, demand .. ',' .. math.max(grant, busy) .. ',' .. (now + ttl))
if redis.call('PTTL', KEYS[1]) < ttl * 2 then
  redis.call('PEXPIRE', KEYS[1], ttl * 2)
end
return grant
"""


class DeliveryBudget(Protocol):
    """One subscription's shared budget (:class:`RedisDeliveryBudget`)."""

    async def share(
        self, worker: str, demand: int, busy: int, limit: int, ttl_ms: int = SLOT_ENTRY_TTL_MS
    ) -> int:
        """How many calls ``worker`` may have going now, of ``limit`` for all workers; its
        word counts for ``ttl_ms``."""
        ...

    async def take_rate(self, rate: float, burst: float, need: int, extra: int) -> Grant:
        """``need`` calls (plus up to ``extra`` leased) from the shared rate bucket."""
        ...

    async def leave(self, worker: str) -> None:
        """``worker`` no longer runs the subscription: its slots are free at once."""

    async def shared_breaker(self) -> dict[str, Any] | None:
        """The open breaker some worker published, or None (docs/policies.md §2)."""
        ...

    async def publish_breaker(self, view: dict[str, Any], ttl_ms: int) -> None:
        """This worker's breaker is open: tell the others, for ``ttl_ms``."""

    async def close_breaker(self, at_ms: int, ttl_ms: int) -> None:
        """This worker's probe closed its breaker: the endpoint answers again (the others
        close theirs; said for ``ttl_ms``)."""


class RedisDeliveryBudget:
    def __init__(self, client: Redis[bytes], project: str, subscription: str) -> None:
        self._client = client
        self._slots_key = keys.delivery_slots(project, subscription)
        self._breaker_key = keys.breaker(project, subscription)
        self._rate_keys = (
            keys.delivery_rate(project, subscription),
            keys.delivery_rate(project, subscription) + ":unused",
        )
        self._share = client.register_script(_SHARE)
        self._buckets = RedisTokenBuckets(client)

    async def share(
        self, worker: str, demand: int, busy: int, limit: int, ttl_ms: int = SLOT_ENTRY_TTL_MS
    ) -> int:
        granted = await self._share(
            keys=[self._slots_key], args=[worker, demand, busy, limit, ttl_ms]
        )
        return int(granted)

    async def take_rate(self, rate: float, burst: float, need: int, extra: int) -> Grant:
        return await self._buckets.take(self._rate_keys, ((rate, burst, need, extra), (0, 1, 0, 0)))

    async def leave(self, worker: str) -> None:
        await self._client.hdel(self._slots_key, worker)

    async def shared_breaker(self) -> dict[str, Any] | None:
        raw = await self._client.get(self._breaker_key)
        return None if raw is None else dict(orjson.loads(raw))

    async def publish_breaker(self, view: dict[str, Any], ttl_ms: int) -> None:
        await self._client.set(self._breaker_key, orjson.dumps(view), px=ttl_ms)

    async def close_breaker(self, at_ms: int, ttl_ms: int) -> None:
        closed = {"state": "closed", "since_ms": at_ms}
        await self._client.set(self._breaker_key, orjson.dumps(closed), px=ttl_ms)
