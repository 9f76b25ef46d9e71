"""The group-state store: what delivery keeps in Redis for one subscription (DESIGN §4).

Per partition index it holds the failed groups (a hash per group, absent when healthy), the
records whose outcome is durable above the committed offsets (so replays after a crash skip
them), and the operator's unsideline requests; per subscription, lifetime counters.

Contract (both :class:`RedisGroupStore` and :class:`state.groups_stub.StubGroupStore`):

- :meth:`GroupStore.apply` is atomic: a group's new state, the outcomes it settles, counters and
  release bookkeeping change together or not at all. With ``touches_group`` it first checks
  the stored version against ``expected_version`` and raises :class:`StaleGroupState` on a
  mismatch, so a worker that lost its partition cannot overwrite its successor's state.
- :meth:`GroupStore.apply_batch` carries 2xx outcomes and many writes in one round trip:
  outcomes first, then each write as :meth:`GroupStore.apply` would.
- Callers apply a write only after the Kafka writes it describes are acknowledged.
- Everything of one subscription lives in one Redis Cluster slot (keys share a hash tag).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import orjson
from redis.asyncio import Redis

from setu import names
from state import keys

MAIN_TIER = 0
DLQ_TIER = names.MAX_RETRY_TIERS + 1
EMPTY_COUNTS: tuple[int, ...] = (0,) * (DLQ_TIER + 1)
# Outcome scores: tier * 2**48 + offset stays exact in a double and orders by tier first.
TIER_SCORE = 2**48


class StaleGroupState(Exception):
    """Raised when a group's stored version is not the one the writer expected."""


@dataclass(frozen=True, slots=True)
class GroupState:
    """One failed group. ``counts[t]`` is how many of its messages are unfinished in tier t.

    ``head`` is the head's message id, or None for "the first one reached in the head tier".
    ``released``, ``dlq_from`` and ``failed_at_ms`` matter while the group is in the DLQ:
    dead letters at DLQ offsets >= ``dlq_from`` are the group's, and ``released`` says an
    operator asked for them to be delivered. ``version`` fences concurrent writers.
    """

    counts: tuple[int, ...] = EMPTY_COUNTS
    head: str | None = None
    released: bool = False
    dlq_from: int = -1
    failed_at_ms: int = 0
    version: int = 0

    @property
    def head_tier(self) -> int:
        return max(t for t, n in enumerate(self.counts) if n > 0)

    @property
    def lowest_tier(self) -> int:
        return min(t for t, n in enumerate(self.counts) if n > 0)

    @property
    def parked(self) -> int:
        return sum(self.counts)

    def tier_above(self, tier: int) -> int:
        """The lowest non-empty tier above ``tier``."""
        return min(t for t, n in enumerate(self.counts) if n > 0 and t > tier)

    def to_fields(self, partition: int) -> dict[str, str]:
        return {
            "v": str(self.version),
            "p": str(partition),
            "counts": ",".join(map(str, self.counts)),
            "head": self.head if self.head is not None else "",
            "released": "1" if self.released else "0",
            "dlq_from": str(self.dlq_from),
            "failed_at": str(self.failed_at_ms),
        }

    @classmethod
    def from_fields(cls, fields: Mapping[str, str]) -> GroupState:
        counts = tuple(int(n) for n in fields["counts"].split(","))
        counts = (counts + EMPTY_COUNTS)[: len(EMPTY_COUNTS)]
        return cls(
            counts=counts,
            head=fields.get("head") or None,
            released=fields.get("released") == "1",
            dlq_from=int(fields.get("dlq_from", "-1")),
            failed_at_ms=int(fields.get("failed_at", "0")),
            version=int(fields["v"]),
        )


@dataclass(frozen=True, slots=True)
class StateWrite:
    """One atomic change. ``state`` None with ``touches_group`` deletes the group (healthy)."""

    partition: int
    group: str | None = None
    touches_group: bool = False
    expected_version: int = 0
    state: GroupState | None = None
    outcomes: tuple[tuple[int, int], ...] = ()  # (tier, offset) now durable
    delivered: int = 0
    dead_lettered: int = 0
    retried: int = 0
    unsidelined: tuple[int, ...] = ()  # DLQ offsets delivered again
    releases_done: tuple[int, ...] = ()  # DLQ offsets no longer pending release
    release_request_done: bool = False  # the group's release request was taken up


@dataclass(slots=True)
class PartitionSnapshot:
    """What a worker loads when it is assigned a partition index."""

    states: dict[str, GroupState] = field(default_factory=dict)
    outcomes: set[tuple[int, int]] = field(default_factory=set)
    pending_releases: set[int] = field(default_factory=set)
    release_requests: set[str] = field(default_factory=set)
    seek_generation: int = 0


COUNTERS = ("delivered_total", "dead_lettered", "retried")


class GroupStore(Protocol):
    """Group state of one subscription. Every method may raise redis errors on I/O failure."""

    async def load(self, partition: int) -> PartitionSnapshot: ...

    async def apply(self, write: StateWrite) -> None: ...

    async def record_delivered(self, partition: int, outcomes: Sequence[tuple[int, int]]) -> None:
        """Records 2xx outcomes and counts them in ``delivered_total``."""

    async def apply_batch(
        self, delivered: Mapping[int, Sequence[tuple[int, int]]], writes: Sequence[StateWrite]
    ) -> None:
        """In one round trip: records ``delivered`` 2xx outcomes (per partition), then applies
        ``writes`` in order, each atomically. A stale write raises StaleGroupState; the writes
        before it stay applied, it and those after it do not."""

    async def trim(self, partition: int, committed: Mapping[int, int]) -> None:
        """Forgets outcomes below the committed offset of each tier."""

    async def clear_outcomes(self, partition: int, tier: int) -> None: ...

    async def poll_releases(self, partition: int) -> tuple[set[str], set[int]]:
        """Pending group release requests and single dead letters to deliver again."""

    async def request_release(
        self, partition: int, groups: Iterable[str], offsets: Iterable[int]
    ) -> None: ...

    async def group(self, group_id: str) -> GroupState | None: ...

    async def failed_count(self) -> int: ...

    async def counters(self) -> dict[str, int]: ...

    async def unsidelined(self, partition: int) -> set[int]: ...

    async def mark_seek_applied(self, partition: int, generation: int) -> None: ...


_APPLY = """
local b = cjson.decode(ARGV[1])
local function each(cmd, key, items, step)
  for i = 1, #items, step do
    redis.call(cmd, key, unpack(items, i, math.min(i + step - 1, #items)))
  end
end
local total = 0
for _, d in ipairs(b.delivered) do
  each('ZADD', KEYS[d.z], d.m, 1000)
  total = total + d.n
end
if total > 0 then
  redis.call('HINCRBY', KEYS[b.counters], 'delivered_total', total)
end
for _, w in ipairs(b.writes) do
  if w.touch then
    local v = tonumber(redis.call('HGET', KEYS[w.g], 'v') or '0')
    if v ~= w.expect then
      return redis.error_reply(
        'STALE ' .. w.group .. ': stored version ' .. v .. ', expected ' .. w.expect)
    end
    redis.call('DEL', KEYS[w.g])
    if w.fields then
      redis.call('HSET', KEYS[w.g], unpack(w.fields))
      redis.call('SADD', KEYS[w.f], w.group)
      redis.call('SADD', KEYS[w.pf], w.group)
    else
      redis.call('SREM', KEYS[w.f], w.group)
      redis.call('SREM', KEYS[w.pf], w.group)
    end
  end
  each('ZADD', KEYS[w.z], w.outcomes, 1000)
  for name, n in pairs(w.counters) do
    redis.call('HINCRBY', KEYS[b.counters], name, n)
  end
  each('SADD', KEYS[w.u], w.unsidelined, 1000)
  each('ZREM', KEYS[w.pr], w.releases_done, 1000)
  if w.release_done then
    redis.call('SREM', KEYS[w.rr], w.group)
  end
end
return 1
"""


def outcome_entry(tier: int, offset: int) -> tuple[int, str]:
    """Score and member of one outcome in the delivered sorted set."""
    return tier * TIER_SCORE + offset, f"{tier}:{offset}"


def _members(outcomes: Sequence[tuple[int, int]]) -> list[str]:
    """score, member, score, member... as strings: Lua would print a large number with 14
    digits and lose the offset."""
    out: list[str] = []
    for tier, offset in outcomes:
        score, member = outcome_entry(tier, offset)
        out += [str(score), member]
    return out


def parse_outcome(member: bytes | str) -> tuple[int, int]:
    text = member.decode() if isinstance(member, bytes) else member
    tier, _, offset = text.partition(":")
    return int(tier), int(offset)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class _KeyList:
    """KEYS of one script call: each name once, referred to by its 1-based index, so the
    script declares every key it touches (all in the subscription's hash slot)."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self._index: dict[str, int] = {}

    def __call__(self, name: str) -> int:
        index = self._index.get(name)
        if index is None:
            self.names.append(name)
            index = self._index[name] = len(self.names)
        return index


class RedisGroupStore:
    """:class:`GroupStore` on Redis; one instance per subscription."""

    def __init__(self, redis: Redis[bytes], project: str, subscription: str) -> None:
        self._redis = redis
        self._project = project
        self._sub = subscription
        self._apply_script = redis.register_script(_APPLY)

    async def load(self, partition: int) -> PartitionSnapshot:
        p, s = self._project, self._sub
        members = await self._redis.smembers(keys.partition_failed(p, s, partition))
        groups = sorted(_text(m) for m in members)
        snap = PartitionSnapshot()
        if groups:
            pipe = self._redis.pipeline(transaction=False)
            for g in groups:
                pipe.hgetall(keys.group_state(p, s, g))
            for g, raw in zip(groups, await pipe.execute(), strict=True):
                if raw:
                    snap.states[g] = GroupState.from_fields(
                        {_text(k): _text(v) for k, v in raw.items()}
                    )
        pipe = self._redis.pipeline(transaction=False)
        pipe.zrange(keys.delivered(p, s, partition), 0, -1)
        pipe.zrange(keys.pending_releases(p, s, partition), 0, -1)
        pipe.smembers(keys.release_requests(p, s, partition))
        pipe.hget(keys.seeks_applied(p, s), str(partition))
        outcomes, pending, requests, seek = await pipe.execute()
        snap.outcomes = {parse_outcome(m) for m in outcomes}
        snap.pending_releases = {int(m) for m in pending}
        snap.release_requests = {_text(m) for m in requests}
        snap.seek_generation = int(seek or 0)
        return snap

    async def apply(self, write: StateWrite) -> None:
        await self.apply_batch({}, [write])

    async def record_delivered(self, partition: int, outcomes: Sequence[tuple[int, int]]) -> None:
        await self.apply_batch({partition: outcomes}, [])

    async def apply_batch(
        self, delivered: Mapping[int, Sequence[tuple[int, int]]], writes: Sequence[StateWrite]
    ) -> None:
        if not writes and not any(delivered.values()):
            return
        p, s = self._project, self._sub
        key = _KeyList()
        payload = {
            "counters": key(keys.counters(p, s)),
            "delivered": [
                {"z": key(keys.delivered(p, s, part)), "m": _members(entries), "n": len(entries)}
                for part, entries in delivered.items()
                if entries
            ],
            "writes": [self._write(write, key) for write in writes],
        }
        try:
            await self._apply_script(keys=key.names, args=[orjson.dumps(payload)])
        except Exception as exc:
            if "STALE" in str(exc):
                raise StaleGroupState(str(exc)) from exc
            raise

    def _write(self, write: StateWrite, key: _KeyList) -> dict[str, object]:
        p, s, partition = self._project, self._sub, write.partition
        group = write.group or ""
        counters = {
            name: n
            for name, n in (
                ("delivered_total", write.delivered),
                ("dead_lettered", write.dead_lettered),
                ("retried", write.retried),
            )
            if n
        }
        out: dict[str, object] = {
            "group": group,
            "g": key(keys.group_state(p, s, group)),
            "f": key(keys.failed_groups(p, s)),
            "pf": key(keys.partition_failed(p, s, partition)),
            "z": key(keys.delivered(p, s, partition)),
            "u": key(keys.unsidelined(p, s, partition)),
            "pr": key(keys.pending_releases(p, s, partition)),
            "rr": key(keys.release_requests(p, s, partition)),
            "touch": write.touches_group,
            "expect": write.expected_version,
            "outcomes": _members(write.outcomes),
            "counters": counters,
            "unsidelined": [str(o) for o in write.unsidelined],
            "releases_done": [str(o) for o in write.releases_done],
            "release_done": write.release_request_done,
        }
        if write.touches_group and write.state is not None:
            fields = write.state.to_fields(partition)
            out["fields"] = [x for kv in fields.items() for x in kv]
        return out

    async def trim(self, partition: int, committed: Mapping[int, int]) -> None:
        if not committed:
            return
        key = keys.delivered(self._project, self._sub, partition)
        pipe = self._redis.pipeline(transaction=False)
        for tier, offset in committed.items():
            if offset > 0:
                pipe.zremrangebyscore(key, tier * TIER_SCORE, tier * TIER_SCORE + offset - 1)
        await pipe.execute()

    async def clear_outcomes(self, partition: int, tier: int) -> None:
        key = keys.delivered(self._project, self._sub, partition)
        await self._redis.zremrangebyscore(key, tier * TIER_SCORE, (tier + 1) * TIER_SCORE - 1)

    async def poll_releases(self, partition: int) -> tuple[set[str], set[int]]:
        p, s = self._project, self._sub
        pipe = self._redis.pipeline(transaction=False)
        pipe.smembers(keys.release_requests(p, s, partition))
        pipe.zrange(keys.pending_releases(p, s, partition), 0, -1)
        groups, offsets = await pipe.execute()
        return {_text(g) for g in groups}, {int(o) for o in offsets}

    async def request_release(
        self, partition: int, groups: Iterable[str], offsets: Iterable[int]
    ) -> None:
        p, s = self._project, self._sub
        group_list = list(groups)
        offset_map: dict[str | bytes, bytes | float | int | str] = {str(o): o for o in offsets}
        pipe = self._redis.pipeline(transaction=True)
        if group_list:
            pipe.sadd(keys.release_requests(p, s, partition), *group_list)
        if offset_map:
            pipe.zadd(keys.pending_releases(p, s, partition), offset_map)
        await pipe.execute()

    async def group(self, group_id: str) -> GroupState | None:
        raw = await self._redis.hgetall(keys.group_state(self._project, self._sub, group_id))
        if not raw:
            return None
        return GroupState.from_fields({_text(k): _text(v) for k, v in raw.items()})

    async def failed_count(self) -> int:
        return int(await self._redis.scard(keys.failed_groups(self._project, self._sub)))

    async def counters(self) -> dict[str, int]:
        raw = await self._redis.hgetall(keys.counters(self._project, self._sub))
        got = {_text(k): int(v) for k, v in raw.items()}
        return {name: got.get(name, 0) for name in COUNTERS}

    async def unsidelined(self, partition: int) -> set[int]:
        members = await self._redis.smembers(keys.unsidelined(self._project, self._sub, partition))
        return {int(m) for m in members}

    async def mark_seek_applied(self, partition: int, generation: int) -> None:
        await self._redis.hset(
            keys.seeks_applied(self._project, self._sub), str(partition), str(generation)
        )
