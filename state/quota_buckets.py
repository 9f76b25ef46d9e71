"""Produce-quota token buckets shared by every API replica, in Redis (docs/security.md §6).

A project has a messages bucket and a bytes bucket, each refilled at the quota's rate up to
one second's worth. One Lua script, timed by the Redis server's clock (so replicas' clocks do
not matter), takes from both at once:

- A request is admitted when every limited bucket holds at least what it needs, or a full
  second's worth if it needs more (so a batch bigger than the burst still passes, when the
  bucket is full, and leaves the bucket in debt that later requests wait out: the average rate
  holds).
- Admitted, it also takes up to ``extra`` more from each bucket, a lease the replica spends
  locally on the next requests without asking Redis (``api/quotas.py``).
- Refused, it takes nothing and says how long until the request would be admitted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from redis.asyncio import Redis

from setu.model import ProduceQuota
from state import keys


@dataclass(frozen=True, slots=True)
class Grant:
    admitted: bool
    # Refused: milliseconds until the same request would be admitted.
    wait_ms: int = 0
    # Admitted: what was leased beyond the request.
    extra_messages: int = 0
    extra_bytes: int = 0


class QuotaBuckets(Protocol):
    async def take(
        self,
        project: str,
        quota: ProduceQuota,
        messages: int,
        nbytes: int,
        extra_messages: int,
        extra_bytes: int,
    ) -> Grant: ...


# KEYS: messages bucket, bytes bucket. ARGV, per bucket: rate (0: not limited), burst, need,
# extra. Returns {admitted, wait_ms, extra messages, extra bytes}.
_TAKE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local seen = {}
local wait = 0
for i = 1, 2 do
  local rate = tonumber(ARGV[i * 4 - 3])
  if rate > 0 then
    local burst, need = tonumber(ARGV[i * 4 - 2]), tonumber(ARGV[i * 4 - 1])
    local held = redis.call('HMGET', KEYS[i], 'tokens', 'at')
    local tokens, at = tonumber(held[1]) or burst, tonumber(held[2]) or now
    if now > at then tokens = math.min(burst, tokens + (now - at) * rate / 1000) end
    local admit = math.min(need, burst)
    if tokens < admit then
      wait = math.max(wait, math.ceil((admit - tokens) * 1000 / rate))
    end
    seen[i] = {tokens, rate, burst, need}
  end
end
if wait > 0 then return {0, wait, 0, 0} end
local extras = {0, 0}
for i = 1, 2 do
  local s = seen[i]
  if s then
    local tokens, rate, burst, need = s[1], s[2], s[3], s[4]
    local extra = math.floor(math.max(0, math.min(tonumber(ARGV[i * 4]), tokens - need)))
    tokens = tokens - need - extra
    extras[i] = extra
    redis.call('HSET', KEYS[i], 'tokens', tostring(tokens), 'at', now)
    redis.call('PEXPIRE', KEYS[i], math.ceil((burst - tokens) * 1000 / rate) + 1000)
  end
end
return {1, 0, extras[1], extras[2]}
"""


def burst(rate: float) -> float:
    """A bucket holds one second of its rate (at least one unit)."""
    return max(rate, 1.0)


class RedisTokenBuckets:
    """The script over any pair of buckets of one hash tag; ``specs``: per bucket (rate (0:
    not limited), burst, need, extra). Delivery's shared call rate uses it too
    (state/delivery_budget.py)."""

    def __init__(self, client: Redis[bytes]) -> None:
        self._script = client.register_script(_TAKE)

    async def take(
        self, pair: tuple[str, str], specs: tuple[tuple[float, float, int, int], ...]
    ) -> Grant:
        args = [value for spec in specs for value in spec]
        answer = await self._script(keys=list(pair), args=args)
        admitted, wait_ms, extra_a, extra_b = (int(v) for v in answer)
        return Grant(bool(admitted), wait_ms, extra_a, extra_b)


class RedisQuotaBuckets:
    def __init__(self, client: Redis[bytes]) -> None:
        self._buckets = RedisTokenBuckets(client)

    async def take(
        self,
        project: str,
        quota: ProduceQuota,
        messages: int,
        nbytes: int,
        extra_messages: int,
        extra_bytes: int,
    ) -> Grant:
        by_count, by_size = quota.messages_per_second or 0, quota.bytes_per_second or 0
        return await self._buckets.take(
            (keys.produce_quota(project, "messages"), keys.produce_quota(project, "bytes")),
            (
                (by_count, burst(by_count), messages, extra_messages),
                (by_size, burst(by_size), nbytes, extra_bytes),
            ),
        )
