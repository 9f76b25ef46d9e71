"""The group-state store: what delivery keeps in Redis for one subscription (docs/design.md §4).

Per partition index it holds the failed groups (a hash per group, absent when healthy), the
records whose outcome is durable above the committed offsets (so replays after a crash skip
them), the operator's unsideline requests, the single dead letters delivered again, and the
owner epoch that fences a worker which lost the partition; per subscription, lifetime counters.

Contract (both :class:`RedisGroupStore` and :class:`state.groups_stub.StubGroupStore`):

- :meth:`GroupStore.apply` is atomic: a group's new state, the outcomes it settles, counters and
  release bookkeeping change together or not at all. With ``touches_group`` it first checks
  the stored version against ``expected_version`` and raises :class:`StaleGroupState` on a
  mismatch, so a worker that lost its partition cannot overwrite its successor's state.
- :meth:`GroupStore.apply_batch` carries 2xx outcomes and many writes in one round trip:
  outcomes first, then each write as :meth:`GroupStore.apply` would.
- Ownership: :meth:`GroupStore.claim` bumps a partition's owner epoch when a worker takes it
  over. A write or outcome that names an epoch (``epochs``) is refused with :class:`Fenced`,
  all of the call at once, when the partition's epoch has moved on since: a worker that
  stalled and lost its partitions cannot change state its successor owns.
- Callers apply a write only after the Kafka writes it describes are acknowledged.
- Everything of one subscription lives in one Redis Cluster slot (keys share a hash tag).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import orjson
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from setu.clock import now_ms
from setu.ordering.groups import Standing, standing
from setu.ordering.state import (
    EMPTY_COUNTS,
    NOTHING_DONE,
    Fenced,
    GroupState,
    PartitionSnapshot,
    ReleaseRequests,
    StaleGroupState,
    StateLost,
    StateWrite,
)
from state import keys


@dataclass(frozen=True, slots=True)
class UnhealthyGroup:
    group_id: str
    # When the group became unhealthy (its first failure since it was last healthy).
    since_ms: int
    state: GroupState


@dataclass(frozen=True, slots=True)
class UnhealthyPage:
    groups: list[UnhealthyGroup]
    # Where the next page starts; None when this one reached the end.
    next: tuple[int, str] | None


# Outcome scores: tier * 2**48 + offset stays exact in a double and orders by tier first.
TIER_SCORE = 2**48


def encode_state(state: GroupState, partition: int) -> dict[str, str]:
    """A group's state as the fields of its Redis hash."""
    return {
        "v": str(state.version),
        "p": str(partition),
        "counts": ",".join(map(str, state.counts)),
        "head": state.head if state.head is not None else "",
        "released": "1" if state.released else "0",
        "dlq_from": str(state.dlq_from),
        "failed_at": str(state.failed_at_ms),
        "lap": str(state.lap),
        "attempts": str(state.attempts),
        "status": "" if state.last_status is None else str(state.last_status),
        "reason": state.reason,
        "due": str(state.due_at_ms),
        "done": ",".join(map(str, state.done)),
        "held": str(state.held),
    }


def decode_state(fields: Mapping[str, str]) -> GroupState:
    """Inverse of :func:`encode_state`."""
    counts = tuple(int(n) for n in fields["counts"].split(","))
    counts = (counts + EMPTY_COUNTS)[: len(EMPTY_COUNTS)]
    return GroupState(
        counts=counts,
        head=fields.get("head") or None,
        released=fields.get("released") == "1",
        dlq_from=int(fields.get("dlq_from", "-1")),
        failed_at_ms=int(fields.get("failed_at", "0")),
        version=int(fields["v"]),
        lap=int(fields.get("lap") or "0"),
        attempts=int(fields.get("attempts") or "0"),
        last_status=int(fields["status"]) if fields.get("status") else None,
        reason=fields.get("reason", ""),
        due_at_ms=int(fields.get("due") or "0"),
        done=_done(fields.get("done")),
        held=int(fields.get("held") or "-1"),
    )


def _done(text: str | None) -> tuple[int, ...]:
    """The done marks (a state written before they existed has none: nothing known)."""
    if not text:
        return NOTHING_DONE
    marks = tuple(int(n) for n in text.split(","))
    return (marks + NOTHING_DONE)[: len(NOTHING_DONE)]


COUNTERS = ("delivered_total", "dead_lettered", "retried")


class GroupStore(Protocol):
    """Group state of one subscription. Every method may raise redis errors on I/O failure."""

    # Takeovers that found Redis without the partition's latest state and rebuilt it
    # (state/durable_groups.py); always 0 for a store without a changelog.
    rebuilt_after_loss: int

    async def claim(self, partition: int) -> int:
        """Makes the caller the partition's owner: returns its new owner epoch."""

    async def record_fences(
        self, partition: int, epoch: int, ends: Mapping[int, int], keep: int = 64
    ) -> None:
        """Records where each tier ended when ``epoch`` took the partition over (see
        :mod:`setu.ordering.fencing`); keeps the ``keep`` latest epochs' fences."""

    async def load(self, partition: int) -> PartitionSnapshot: ...

    async def fences(self, partition: int) -> dict[int, dict[int, int]]:
        """The fences :meth:`record_fences` kept, by epoch."""

    async def never_owned(self, partition: int) -> bool:
        """Whether the API created the subscription and no owner claimed ``partition`` since,
        so that its consumer group holds no offsets there (known from the changelog only)."""
        ...

    async def apply(self, write: StateWrite, epoch: int | None = None) -> None: ...

    async def record_delivered(self, partition: int, outcomes: Sequence[tuple[int, int]]) -> None:
        """Records 2xx outcomes and counts them in ``delivered_total``."""

    async def apply_batch(
        self,
        delivered: Mapping[int, Sequence[tuple[int, int]]],
        writes: Sequence[StateWrite],
        epochs: Mapping[int, int] | None = None,
    ) -> None:
        """In one round trip: records ``delivered`` 2xx outcomes (per partition), then applies
        ``writes`` in order, each atomically. When a partition named in ``epochs`` has another
        epoch now, nothing at all is applied and :class:`Fenced` is raised. A stale write
        raises StaleGroupState; the writes before it stay applied, it and those after it do
        not."""

    async def trim(self, partition: int, committed: Mapping[int, int]) -> None:
        """Forgets outcomes below the committed offset of each tier."""

    async def clear_outcomes(self, partition: int, tier: int) -> None: ...

    async def poll_releases(self, partition: int) -> ReleaseRequests:
        """What operators asked of the partition and is still to be carried out."""

    async def request_release(
        self, partition: int, groups: Iterable[str], offsets: Iterable[int]
    ) -> None:
        """Adds to the partition's :class:`ReleaseRequests`."""

    async def group(self, group_id: str) -> GroupState | None: ...

    async def states_of(self, group_ids: Iterable[str]) -> dict[str, GroupState]:
        """The states of those of ``group_ids`` that are failed."""

    async def failed_count(self) -> int: ...

    async def failed_groups(self) -> list[str]:
        """The ids of the subscription's failed groups, sorted."""
        ...

    async def unhealthy(
        self, standing: Standing | None, limit: int, after: tuple[int, str] | None
    ) -> UnhealthyPage:
        """Up to ``limit`` failed groups (of one standing, or both), the longest unhealthy
        first, after the cursor ``(since_ms, group_id)``; costs O(limit), not O(groups)."""
        ...

    async def oldest_unhealthy(self) -> dict[Standing, int]:
        """Per standing, when its longest-unhealthy group first failed (ms)."""
        ...

    async def clear(self) -> int:
        """Forgets everything of the subscription (it is being deleted); returns how many
        records (Redis keys) there were."""
        ...

    async def counters(self) -> dict[str, int]: ...

    async def redelivered(self, partition: int) -> set[int]:
        """DLQ offsets of single dead letters delivered again (or sent through the tiers
        again): no longer live, so browsing hides them."""

    async def trim_dead_letters(self, partition: int, log_start: int) -> None:
        """Forgets redelivered and pending single letters below the DLQ's first offset:
        retention removed them, nobody can read them again."""

    async def mark_seek_applied(self, partition: int, generation: int) -> None: ...


_APPLY = """
local b = cjson.decode(ARGV[1])
local fenced = {}
local lost = {}
for _, e in ipairs(b.epochs) do
  local now = tonumber(redis.call('GET', KEYS[e.k]) or '0')
  if now > e.epoch then
    table.insert(fenced, e.p .. '=' .. now)
  elseif now < e.epoch then
    table.insert(lost, e.p .. '=' .. now)
  elseif e.w then
    -- Writes since the claim: fewer than the owner made means Redis lost some.
    local n = tonumber(redis.call('GET', KEYS[e.w]) or '-1')
    if n < e.n then
      table.insert(lost, e.p .. '=' .. now .. '/' .. n)
    end
  end
end
if #fenced > 0 then
  return redis.error_reply('FENCED ' .. table.concat(fenced, ','))
end
if #lost > 0 then
  return redis.error_reply('LOST ' .. table.concat(lost, ','))
end
for _, e in ipairs(b.epochs) do
  if e.w then
    redis.call('INCR', KEYS[e.w])
  end
end
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
      -- The index keeps when the group became unhealthy across its changes of standing.
      local since = redis.call('ZSCORE', KEYS[w.ui], w.group)
      for _, uo in ipairs(w.uo) do
        since = since or redis.call('ZSCORE', KEYS[uo], w.group)
        redis.call('ZREM', KEYS[uo], w.group)
      end
      if not since then
        local t = redis.call('TIME')
        since = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
      end
      redis.call('ZADD', KEYS[w.ui], since, w.group)
    else
      redis.call('SREM', KEYS[w.f], w.group)
      redis.call('SREM', KEYS[w.pf], w.group)
      redis.call('ZREM', KEYS[w.ui], w.group)
      for _, uo in ipairs(w.uo) do
        redis.call('ZREM', KEYS[uo], w.group)
      end
    end
  end
  each('ZADD', KEYS[w.z], w.outcomes, 1000)
  for name, n in pairs(w.counters) do
    redis.call('HINCRBY', KEYS[b.counters], name, n)
  end
  each('ZADD', KEYS[w.u], w.redelivered, 1000)
  each('ZREM', KEYS[w.pr], w.releases_done, 1000)
  if w.release_done then
    redis.call('SREM', KEYS[w.rr], w.group)
  end
end
return 1
"""


# KEYS: group state, the index it belongs in, the other indexes. ARGV: group, since. Adds a
# group still failed and in no index.
_INDEX_OLDER = """
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
for i = 3, #KEYS do
  if redis.call('ZSCORE', KEYS[i], ARGV[1]) then
    return 0
  end
end
return redis.call('ZADD', KEYS[2], 'NX', ARGV[2], ARGV[1])
"""


# A partition's group state as one server holds it at one moment: a script runs alone, so
# nothing can change between the failed set and the groups' hashes it names. One command,
# where a WATCH transaction took three round trips and a connection of its own: a worker
# taking over a thousand subscriptions sends the loads of all of them in a few pipelines
# (state/redis_clients.py). KEYS: the partition's failed set, delivered outcomes, pending
# releases, release requests, the seeks applied, its fences, owner epoch and owner writes;
# ARGV: the group-state keys' prefix (the subscription's hash tag: the same slot), the
# partition. The groups' keys are made here from the set's members.
_LOAD = """
local groups = redis.call('SMEMBERS', KEYS[1])
local states = {}
for i, g in ipairs(groups) do
  states[i] = redis.call('HGETALL', ARGV[1] .. g)
end
return {
  groups,
  states,
  redis.call('ZRANGE', KEYS[2], 0, -1),
  redis.call('ZRANGE', KEYS[3], 0, -1),
  redis.call('SMEMBERS', KEYS[4]),
  redis.call('HGETALL', KEYS[6]),
  {redis.call('HGET', KEYS[5], ARGV[2]), redis.call('GET', KEYS[7]), redis.call('GET', KEYS[8])},
}
"""


# Redis made to hold exactly what a takeover rebuilt from the changelog for one partition
# (RedisGroupStore.restore), in one script: a server holds all of it or none, as the
# transaction it replaces did, in one command that goes with other commands instead of four
# round trips on a connection of its own. KEYS: the partition's failed set, the
# subscription's failed set, owner epoch, owner writes, release requests, pending releases,
# delivered-again letters, fences, seeks applied, loaded partitions, then the unhealthy index
# of each standing. ARGV[1]: JSON {prefix (of group-state keys), partition, epoch, seek,
# groups [{g, f (fields, flat), k (1-based standing), s (its score)}], requests, pending,
# again (flat score/member lists), fences (flat field/value)}; numbers as strings, which
# cjson would round.
_RESTORE = """
local b = cjson.decode(ARGV[1])
local kinds = #KEYS - 10
local function each(cmd, key, items, step)
  for i = 1, #items, step do
    redis.call(cmd, key, unpack(items, i, math.min(i + step - 1, #items)))
  end
end
local keep = {}
for _, w in ipairs(b.groups) do keep[w.g] = true end
for _, g in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  if not keep[g] then
    redis.call('DEL', b.prefix .. g)
    redis.call('SREM', KEYS[2], g)
    redis.call('SREM', KEYS[1], g)
    for i = 1, kinds do redis.call('ZREM', KEYS[10 + i], g) end
  end
end
redis.call('SET', KEYS[3], b.epoch)
redis.call('SET', KEYS[4], 0)
for _, w in ipairs(b.groups) do
  local key = b.prefix .. w.g
  redis.call('DEL', key)
  each('HSET', key, w.f, 1000)
  redis.call('SADD', KEYS[2], w.g)
  redis.call('SADD', KEYS[1], w.g)
  for i = 1, kinds do
    if i ~= w.k then redis.call('ZREM', KEYS[10 + i], w.g) end
  end
  redis.call('ZADD', KEYS[10 + w.k], 'NX', w.s, w.g)
end
redis.call('DEL', KEYS[5], KEYS[6], KEYS[7], KEYS[8])
each('SADD', KEYS[5], b.requests, 1000)
each('ZADD', KEYS[6], b.pending, 1000)
each('ZADD', KEYS[7], b.again, 1000)
each('HSET', KEYS[8], b.fences, 1000)
redis.call('HSET', KEYS[9], b.partition, b.seek)
redis.call('HSET', KEYS[10], b.partition, b.epoch)
return 1
"""


# Once per partition: an older version kept delivered-again offsets in a plain set (of every
# letter, grouped or not, never trimmed). Only single letters need remembering now.
_ADOPT_LEGACY = """
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
local members = redis.call('SMEMBERS', KEYS[1])
for i = 1, #members, 500 do
  local args = {}
  for j = i, math.min(i + 499, #members) do
    table.insert(args, members[j])
    table.insert(args, members[j])
  end
  redis.call('ZADD', KEYS[2], unpack(args))
end
redis.call('DEL', KEYS[1])
return #members
"""


def _encode_fence(ends: Mapping[int, int]) -> str:
    return ",".join(f"{tier}:{offset}" for tier, offset in sorted(ends.items()))


def _decode_fence(text: str) -> dict[int, int]:
    out = {}
    for item in filter(None, text.split(",")):
        tier, _, offset = item.partition(":")
        out[int(tier)] = int(offset)
    return out


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


def _pairs(flat: Sequence[bytes | str]) -> dict[str, str]:
    """A hash as a script returns it (field, value, field, value...)."""
    return {_text(flat[i]): _text(flat[i + 1]) for i in range(0, len(flat) - 1, 2)}


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


def held_by_redis(epoch: bytes | None, writes: bytes | None) -> tuple[int, int]:
    """(owner epoch, writes since its claim) from the two keys' values ((0, -1): none)."""
    return int(epoch or 0), int(writes if writes is not None else -1)


@dataclass(frozen=True, slots=True)
class SubscriptionReading:
    """One subscription's figures a delivery worker reads each second (delivery/watch.py)."""

    release_version: int
    breaker: bytes | None  # the shared breaker's word (state/delivery_budget.py), raw
    held: dict[int, tuple[int, int]]  # partition -> (owner epoch, writes) Redis holds


@functools.lru_cache(maxsize=16_384)
def _reading_keys(project: str, subscription: str, partitions: tuple[int, ...]) -> list[str]:
    """The keys :func:`read_subscriptions` reads for one subscription, in its order: made
    once, not each second for each of a worker's subscriptions."""
    names = [keys.release_version(project, subscription), keys.breaker(project, subscription)]
    for partition in partitions:
        names.append(keys.owner_epoch(project, subscription, partition))
        names.append(keys.owner_writes(project, subscription, partition))
    return names


async def announce_subscriptions(client: Redis[bytes]) -> None:
    """Raises the subscriptions' change count (``keys.subscriptions_changed``): every worker
    lists the subscriptions within a second (delivery/watch.py) instead of at its backstop
    listing. Called by every writer of a subscription's record, the API and a worker's
    policy pause alike."""
    await client.incr(keys.subscriptions_changed())


class RepeatedRead:
    """An ``MGET`` sent again and again with mostly the same names (the state watch's, each
    second): its command is packed once and sent as it is while the names stay the same.
    Packing is Python; at 1,000 subscriptions it was 4.0 ms of the 4.4 ms of a worker's CPU
    a reading cost, where sending the packed command and parsing the answer took 0.2 ms."""

    def __init__(self) -> None:
        self._names: list[str] = []
        self._packed: Any = None

    async def mget(self, client: Redis[bytes], names: list[str]) -> list[bytes | None]:
        try:
            return await self._mget(client, names)
        except (RedisConnectionError, RedisTimeoutError):
            # A connection Redis closed since the last reading (a restart, a failover): once
            # more on a new one, as the client's own commands do.
            return await self._mget(client, names)

    async def _mget(self, client: Redis[bytes], names: list[str]) -> list[bytes | None]:
        pool = client.connection_pool
        connection = await pool.get_connection()
        try:
            if self._packed is None or names != self._names:
                self._packed = connection.pack_command("MGET", *names)
                self._names = names
            await connection.send_packed_command(self._packed)
            replies: list[bytes | None] = await connection.read_response()
        except BaseException:
            # A reply half read would be taken for the next command's.
            await connection.disconnect()
            raise
        finally:
            await pool.release(connection)
        return replies


async def read_subscriptions(
    client: Redis[bytes],
    wanted: Sequence[tuple[str, str, Sequence[int]]],
    repeated: RepeatedRead | None = None,
) -> tuple[int, list[list[bytes | None]]]:
    """In one ``MGET``: the subscriptions' change count (``keys.subscriptions_changed``)
    and, for each (project, subscription, partitions) of ``wanted``, the raw values of its
    release version, its shared breaker, and each partition's owner figures, which
    :func:`parse_reading` reads. Raw, so a caller can leave those that did not change since
    its last reading unparsed: most of them, each second (parsing them all was a tenth of an
    idle worker's CPU at 1,000 subscriptions). (A pipeline of one ``GET`` per key cost a
    worker serving 1,000 subscriptions a third of its event loop: 8,000 commands built and
    parsed every second.) ``repeated``: the caller's :class:`RepeatedRead`, for a reading
    made again and again."""
    names = [keys.subscriptions_changed()]
    for project, subscription, partitions in wanted:
        names.extend(_reading_keys(project, subscription, tuple(partitions)))
    replies = await (client.mget(names) if repeated is None else repeated.mget(client, names))
    changed = int(replies[0] or 0)
    out = []
    at = 1
    for _, _, partitions in wanted:
        size = 2 + 2 * len(partitions)
        out.append(replies[at : at + size])
        at += size
    return changed, out


def parse_reading(raw: Sequence[bytes | None], partitions: Sequence[int]) -> SubscriptionReading:
    """One subscription's values of :func:`read_subscriptions`, for ``partitions`` in the
    order asked."""
    held = {p: held_by_redis(raw[2 + 2 * i], raw[3 + 2 * i]) for i, p in enumerate(partitions)}
    return SubscriptionReading(int(raw[0] or 0), raw[1], held)


class RedisGroupStore:
    """:class:`GroupStore` on Redis; one instance per subscription."""

    rebuilt_after_loss = 0

    def __init__(self, redis: Redis[bytes], project: str, subscription: str) -> None:
        self._redis = redis
        self._project = project
        self._sub = subscription
        self.label = f"subscription {project}/{subscription}"  # for the log
        self._apply_script = redis.register_script(_APPLY)
        self._adopt_script = redis.register_script(_ADOPT_LEGACY)
        self._index_script = redis.register_script(_INDEX_OLDER)
        self._load_script = redis.register_script(_LOAD)
        self._restore_script = redis.register_script(_RESTORE)

    async def claim(self, partition: int) -> int:
        return int(await self._redis.incr(keys.owner_epoch(self._project, self._sub, partition)))

    async def owner_epoch(self, partition: int) -> int:
        """The partition's owner epoch as Redis holds it (0: none)."""
        raw = await self._redis.get(keys.owner_epoch(self._project, self._sub, partition))
        return int(raw or 0)

    async def never_owned(self, partition: int) -> bool:
        return False  # Redis alone cannot tell (state/durable_groups.py can)

    async def loaded(self) -> set[int]:
        """The partitions whose state Redis holds in full (``keys.state_loaded``)."""
        raw = await self._redis.hkeys(keys.state_loaded(self._project, self._sub))
        return {int(p) for p in raw}

    async def mark_loaded(self, partitions: Iterable[int]) -> None:
        """A new subscription: nothing to rebuild on any of its partitions."""
        values: dict[str | bytes, bytes | float | int | str] = {str(p): 0 for p in partitions}
        if values:
            await self._redis.hset(keys.state_loaded(self._project, self._sub), mapping=values)

    async def writes_since_claim(self, partition: int) -> tuple[int, int]:
        """(owner epoch, writes since its claim) as Redis holds them ((0, -1): none)."""
        pipe = self._redis.pipeline(transaction=False)
        pipe.get(keys.owner_epoch(self._project, self._sub, partition))
        pipe.get(keys.owner_writes(self._project, self._sub, partition))
        epoch, writes = await pipe.execute()
        return held_by_redis(epoch, writes)

    async def restore(
        self,
        partition: int,
        epoch: int,
        states: Mapping[str, GroupState],
        release_requests: Iterable[str],
        pending: Iterable[int],
        redelivered: Iterable[int],
        seek_generation: int,
        fences: Mapping[int, Mapping[int, int]],
    ) -> None:
        """Makes Redis hold exactly this for ``partition`` (rebuilt from the changelog) under
        the owner ``epoch``: groups Redis knows and the changelog does not are forgotten.
        Recorded outcomes and counters are left as they are. The partition is shown as
        being rebuilt until the end."""
        p, s = self._project, self._sub
        kinds = list(Standing)
        groups = []
        for group, state in sorted(states.items()):
            fields = [x for pair in encode_state(state, partition).items() for x in pair]
            kind = standing(state)[0]
            score = str(state.failed_at_ms or now_ms())
            groups.append({"g": group, "f": fields, "k": kinds.index(kind) + 1, "s": score})
        batch = {
            "prefix": keys.group_state(p, s, ""),
            "partition": str(partition),
            "epoch": str(epoch),
            "seek": str(seek_generation),
            "groups": groups,
            "requests": sorted(release_requests),
            "pending": [x for o in sorted(pending) for x in (str(o), str(o))],
            "again": [x for o in sorted(redelivered) for x in (str(o), str(o))],
            "fences": [x for e, f in sorted(fences.items()) for x in (str(e), _encode_fence(f))],
        }
        await self._restore_script(
            keys=[
                keys.partition_failed(p, s, partition),
                keys.failed_groups(p, s),
                keys.owner_epoch(p, s, partition),
                keys.owner_writes(p, s, partition),
                keys.release_requests(p, s, partition),
                keys.pending_releases(p, s, partition),
                keys.redelivered(p, s, partition),
                keys.fences(p, s, partition),
                keys.seeks_applied(p, s),
                keys.state_loaded(p, s),
                *(keys.unhealthy(p, s, kind.value) for kind in kinds),
            ],
            args=[orjson.dumps(batch)],
        )

    async def record_fences(
        self, partition: int, epoch: int, ends: Mapping[int, int], keep: int = 64
    ) -> None:
        key = keys.fences(self._project, self._sub, partition)
        await self._redis.hset(key, str(epoch), _encode_fence(ends))
        epochs = sorted(int(e) for e in await self._redis.hkeys(key))
        if len(epochs) > keep:
            await self._redis.hdel(key, *(str(e) for e in epochs[: len(epochs) - keep]))

    async def fences(self, partition: int) -> dict[int, dict[int, int]]:
        raw = await self._redis.hgetall(keys.fences(self._project, self._sub, partition))
        return {int(e): _decode_fence(_text(v)) for e, v in raw.items()}

    async def load(self, partition: int) -> PartitionSnapshot:
        """The partition as one server holds it at one moment (one script), with the owner
        epoch and write count it holds beside it (``PartitionSnapshot.owner``)."""
        p, s = self._project, self._sub
        reply = await self._load_script(
            keys=[
                keys.partition_failed(p, s, partition),
                keys.delivered(p, s, partition),
                keys.pending_releases(p, s, partition),
                keys.release_requests(p, s, partition),
                keys.seeks_applied(p, s),
                keys.fences(p, s, partition),
                keys.owner_epoch(p, s, partition),
                keys.owner_writes(p, s, partition),
            ],
            args=[keys.group_state(p, s, ""), str(partition)],
        )
        groups, states, outcomes, pending, requests, fences, (seek, epoch, writes) = reply
        snap = PartitionSnapshot()
        for g, flat in sorted(zip(groups, states, strict=True)):
            if flat:
                snap.states[_text(g)] = decode_state(_pairs(flat))
        snap.outcomes = {parse_outcome(m) for m in outcomes}
        snap.pending_releases = {int(m) for m in pending}
        snap.release_requests = {_text(m) for m in requests}
        snap.seek_generation = int(seek or 0)
        snap.fences = {int(e): _decode_fence(_text(v)) for e, v in _pairs(fences).items()}
        snap.owner = (int(epoch or 0), int(writes if writes is not None else -1))
        return snap

    async def apply(self, write: StateWrite, epoch: int | None = None) -> None:
        await self.apply_batch({}, [write], None if epoch is None else {write.partition: epoch})

    async def record_delivered(self, partition: int, outcomes: Sequence[tuple[int, int]]) -> None:
        await self.apply_batch({partition: outcomes}, [])

    async def apply_batch(
        self,
        delivered: Mapping[int, Sequence[tuple[int, int]]],
        writes: Sequence[StateWrite],
        epochs: Mapping[int, int] | None = None,
        writes_seen: Mapping[int, int] | None = None,
    ) -> None:
        """See :meth:`GroupStore.apply_batch`. With ``writes_seen`` (partition -> how many
        batches this owner applied since its claim), a partition whose Redis counted fewer
        raises :class:`StateLost`, as does one whose epoch went back: Redis forgot."""
        if not writes and not any(delivered.values()):
            return
        p, s = self._project, self._sub
        key = _KeyList()
        seen = writes_seen or {}
        entries: list[dict[str, object]] = []
        for part, epoch in sorted((epochs or {}).items()):
            entry: dict[str, object] = {
                "p": part,
                "k": key(keys.owner_epoch(p, s, part)),
                "epoch": epoch,
            }
            if part in seen:
                entry["w"] = key(keys.owner_writes(p, s, part))
                entry["n"] = seen[part]
            entries.append(entry)
        payload = {
            "epochs": entries,
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
            text = str(exc)
            if "FENCED" in text:
                found = text.split("FENCED", 1)[1].strip()
                parts = [int(item.split("=")[0]) for item in found.split(",") if "=" in item]
                raise Fenced(parts, text) from exc
            if "LOST" in text:
                found = text.split("LOST", 1)[1].strip()
                parts = [int(item.split("=")[0]) for item in found.split(",") if "=" in item]
                raise StateLost(parts, text) from exc
            if "STALE" in text:
                raise StaleGroupState(text) from exc
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
            "u": key(keys.redelivered(p, s, partition)),
            "pr": key(keys.pending_releases(p, s, partition)),
            "rr": key(keys.release_requests(p, s, partition)),
            "touch": write.touches_group,
            "expect": write.expected_version,
            "outcomes": _members(write.outcomes),
            "counters": counters,
            "redelivered": [str(x) for o in write.redelivered for x in (o, o)],
            "releases_done": [str(o) for o in write.releases_done],
            "release_done": write.release_request_done,
        }
        # "ui": the index the group belongs in now, "uo": the others.
        now_in = Standing.RETRYING
        if write.touches_group and write.state is not None:
            fields = encode_state(write.state, partition)
            out["fields"] = [x for kv in fields.items() for x in kv]
            now_in = standing(write.state)[0]
        out["ui"] = key(keys.unhealthy(p, s, now_in.value))
        out["uo"] = [key(keys.unhealthy(p, s, k.value)) for k in Standing if k is not now_in]
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

    async def poll_releases(self, partition: int) -> ReleaseRequests:
        p, s = self._project, self._sub
        pipe = self._redis.pipeline(transaction=False)
        pipe.smembers(keys.release_requests(p, s, partition))
        pipe.zrange(keys.pending_releases(p, s, partition), 0, -1)
        groups, offsets = await pipe.execute()
        return ReleaseRequests({_text(g) for g in groups}, {int(o) for o in offsets})

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
        if group_list or offset_map:
            pipe.incr(keys.release_version(p, s))
        await pipe.execute()

    async def group(self, group_id: str) -> GroupState | None:
        raw = await self._redis.hgetall(keys.group_state(self._project, self._sub, group_id))
        if not raw:
            return None
        return decode_state({_text(k): _text(v) for k, v in raw.items()})

    async def states_of(self, group_ids: Iterable[str]) -> dict[str, GroupState]:
        names = sorted(set(group_ids))
        if not names:
            return {}
        pipe = self._redis.pipeline(transaction=False)
        for g in names:
            pipe.hgetall(keys.group_state(self._project, self._sub, g))
        out = {}
        for g, raw in zip(names, await pipe.execute(), strict=True):
            if raw:
                out[g] = decode_state({_text(k): _text(v) for k, v in raw.items()})
        return out

    async def failed_count(self) -> int:
        return int(await self._redis.scard(keys.failed_groups(self._project, self._sub)))

    async def scheduled_count(self) -> int:
        """Groups whose head waits for its time (docs/scheduling.md): they have a state, and
        count in :meth:`failed_count`, without having failed."""
        key = keys.unhealthy(self._project, self._sub, Standing.SCHEDULED.value)
        return int(await self._redis.zcard(key))

    async def failed_groups(self) -> list[str]:
        members = await self._redis.smembers(keys.failed_groups(self._project, self._sub))
        return sorted(_text(m) for m in members)

    async def unhealthy(
        self, standing: Standing | None, limit: int, after: tuple[int, str] | None
    ) -> UnhealthyPage:
        await self._index_older_groups()
        entries: list[tuple[int, str]] = []
        for kind in [standing] if standing else list(Standing):
            entries += await self._index_page(kind, limit + 1, after)
        entries.sort()
        more = len(entries) > limit
        entries = entries[:limit]
        states = await self.states_of(group for _, group in entries)
        # A group that healed between the two reads is left out; the cursor still moves on.
        found = [UnhealthyGroup(g, since, states[g]) for since, g in entries if g in states]
        return UnhealthyPage(found, entries[-1] if more and entries else None)

    async def oldest_unhealthy(self) -> dict[Standing, int]:
        """Per standing, when its longest-unhealthy group first failed (ms); standings with
        no group are left out. Every message of such a group in a retry tier or the DLQ was
        written after then, so retention deletes none of them before then + retention."""
        pipe = self._redis.pipeline(transaction=False)
        for kind in Standing:
            pipe.zrange(keys.unhealthy(self._project, self._sub, kind.value), 0, 0, withscores=True)
        found = await pipe.execute()
        return {kind: int(rows[0][1]) for kind, rows in zip(Standing, found, strict=True) if rows}

    async def _index_page(
        self, kind: Standing, want: int, after: tuple[int, str] | None
    ) -> list[tuple[int, str]]:
        key = keys.unhealthy(self._project, self._sub, kind.value)
        out: list[tuple[int, str]] = []
        offset = 0
        while len(out) < want:
            rows = await self._redis.zrangebyscore(
                key,
                after[0] if after else "-inf",
                "+inf",
                start=offset,
                num=want,
                withscores=True,
            )
            offset += len(rows)
            for member, score in rows:
                entry = (int(score), _text(member))
                if after is None or entry > after:  # ties at the cursor's time are skipped
                    out.append(entry)
            if len(rows) < want:
                break
        return out[:want]

    async def _index_older_groups(self) -> None:
        """Indexes failed groups an older version left out of the index (once: the counts
        agree from then on)."""
        p, s = self._project, self._sub
        pipe = self._redis.pipeline(transaction=False)
        pipe.scard(keys.failed_groups(p, s))
        for kind in Standing:
            pipe.zcard(keys.unhealthy(p, s, kind.value))
        failed, *indexed = await pipe.execute()
        if failed == sum(indexed):
            return
        for group, state in (await self.states_of(await self.failed_groups())).items():
            kind = standing(state)[0]
            await self._index_script(
                keys=[
                    keys.group_state(p, s, group),
                    keys.unhealthy(p, s, kind.value),
                    *(keys.unhealthy(p, s, k.value) for k in Standing if k is not kind),
                ],
                args=[group, state.failed_at_ms or now_ms()],
            )

    async def clear(self) -> int:
        removed = 0
        batch: list[bytes | str] = []
        pattern = keys.subscription_pattern(self._project, self._sub)
        async for key in self._redis.scan_iter(match=pattern):
            batch.append(key)
            if len(batch) >= 500:
                removed += await self._redis.unlink(*batch)
                batch.clear()
        if batch:
            removed += await self._redis.unlink(*batch)
        return removed

    async def counters(self) -> dict[str, int]:
        raw = await self._redis.hgetall(keys.counters(self._project, self._sub))
        got = {_text(k): int(v) for k, v in raw.items()}
        return {name: got.get(name, 0) for name in COUNTERS}

    async def redelivered(self, partition: int) -> set[int]:
        await self._adopt_legacy(partition)
        members = await self._redis.zrange(
            keys.redelivered(self._project, self._sub, partition), 0, -1
        )
        return {int(m) for m in members}

    async def trim_dead_letters(self, partition: int, log_start: int) -> None:
        await self._adopt_legacy(partition)
        if log_start <= 0:
            return
        p, s = self._project, self._sub
        pipe = self._redis.pipeline(transaction=False)
        pipe.zremrangebyscore(keys.redelivered(p, s, partition), "-inf", log_start - 1)
        pipe.zremrangebyscore(keys.pending_releases(p, s, partition), "-inf", log_start - 1)
        await pipe.execute()

    async def _adopt_legacy(self, partition: int) -> None:
        """Moves an older version's set of delivered-again DLQ offsets into the sorted set."""
        p, s = self._project, self._sub
        await self._adopt_script(
            keys=[keys.legacy_unsidelined(p, s, partition), keys.redelivered(p, s, partition)]
        )

    async def mark_seek_applied(self, partition: int, generation: int) -> None:
        await self._redis.hset(
            keys.seeks_applied(self._project, self._sub), str(partition), str(generation)
        )
