"""Each message's attempt log, in Redis (docs/design.md §9).

Entries are JSON lines appended per message id into one hash per hour, which expires a
whole hour after the log's retention (``SETU_ATTEMPT_LOG_HOURS``): writing costs one Lua
call per flush of many entries, and expiry costs nothing per entry. Reading a message looks it
up in each hour of the retention (one pipelined round trip) and drops entries older than it.

Memory is what this costs: about 125 bytes per message delivered at its first attempt
(measured in bench/delivery.py), so a subscription delivering R messages/s keeps about
R x 125 x 3,600 x hours bytes (failed attempts add theirs, with up to 4 KiB of answer).

:func:`delivery_record` turns a message's entries (written by
``delivery.attempts.AttemptRecorder``) into the operator's view: where the message is now
(delivered, the tier it waits in, or the DLQ) and its attempts and moves in order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import orjson
from redis.asyncio import Redis

from setu.clock import now_ms
from setu.outcome import Verdict
from setu.replay import replay_webhook_id
from state import keys

HOUR_MS = 3_600_000

Entry = tuple[str, bytes]
"""(message id, one entry as a JSON object)."""


class AttemptLog(Protocol):
    async def append(self, entries: Sequence[Entry]) -> None: ...

    async def read(self, message_id: str) -> list[dict[str, Any]]:
        """The message's entries within the retention, oldest first; [] when none."""
        ...


# KEYS[1]: the hour's hash. ARGV[1]: its time to live (s), then message id, line, ...
_APPEND = """
for i = 2, #ARGV, 2 do
  local held = redis.call('HGET', KEYS[1], ARGV[i])
  if held then
    redis.call('HSET', KEYS[1], ARGV[i], held .. '\\n' .. ARGV[i + 1])
  else
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
  end
end
if redis.call('TTL', KEYS[1]) < 0 then
  redis.call('EXPIRE', KEYS[1], ARGV[1])
end
return 1
"""


def _parse(held: bytes | None) -> list[dict[str, Any]]:
    return [] if not held else [orjson.loads(line) for line in held.split(b"\n")]


class RedisAttemptLog:
    def __init__(
        self,
        redis: Redis[bytes],
        project: str,
        subscription: str,
        hours: int,
        clock: Callable[[], int] = now_ms,
    ) -> None:
        self._redis = redis
        self._project, self._sub = project, subscription
        self._hours = hours
        self._clock = clock
        self._append = redis.register_script(_APPEND)

    def _key(self, hour: int) -> str:
        return keys.attempts(self._project, self._sub, hour)

    async def append(self, entries: Sequence[Entry]) -> None:
        if not entries:
            return
        hour = self._clock() // HOUR_MS
        args: list[bytes | str | int] = [(self._hours + 1) * 3600]
        for message_id, line in entries:
            args += [message_id, line]
        await self._append(keys=[self._key(hour)], args=args)

    async def read(self, message_id: str) -> list[dict[str, Any]]:
        now = self._clock()
        oldest = now - self._hours * HOUR_MS
        pipe = self._redis.pipeline(transaction=False)
        for hour in range(oldest // HOUR_MS, now // HOUR_MS + 1):
            pipe.hget(self._key(hour), message_id)
        found = [e for held in await pipe.execute() for e in _parse(held)]
        return sorted((e for e in found if e["t"] >= oldest), key=lambda e: e["t"])


class StubAttemptLog:
    """The same contract in a list, for unit tests."""

    def __init__(self, hours: int = 24, clock: Callable[[], int] = now_ms) -> None:
        self.entries: list[tuple[str, dict[str, Any]]] = []
        self._hours, self._clock = hours, clock

    async def append(self, entries: Sequence[Entry]) -> None:
        self.entries += [(m, orjson.loads(line)) for m, line in entries]

    async def read(self, message_id: str) -> list[dict[str, Any]]:
        oldest = self._clock() - self._hours * HOUR_MS
        found = [e for m, e in self.entries if m == message_id and e["t"] >= oldest]
        return sorted(found, key=lambda e: e["t"])


def delivery_record(message_id: str, entries: list[dict[str, Any]]) -> dict[str, Any]:
    """The operator's view of a message from its log entries, oldest first (pure)."""
    attempts = []
    moves = []
    location = "main"
    deliver_at = None
    for e in entries:
        if "f" in e:
            location = "filtered"
            continue
        if "sched" in e:  # held for its time (docs/scheduling.md)
            location, deliver_at = "scheduled", e["sched"]
            continue
        if "u" in e:  # finished without a call: "cancelled", or "gone" from the main log
            location = e["u"]
            continue
        if "to" in e:
            moves.append({"at_ms": e["t"], "to": e["to"], "why": e["k"]})
            location = e["to"]
            continue
        replay = e.get("r")
        attempts.append(
            {
                "attempt": e["a"],
                "at_ms": e["t"],
                "tier": e["tier"],
                "outcome": e["v"],
                "status": e.get("s"),
                "error": e.get("e"),
                "duration_ms": e["ms"],
                "response_excerpt": e.get("x"),
                # False: failed while the circuit breaker was open; the attempt was not
                # counted and the same number goes out again (docs/policies.md §2).
                "counted": "g" not in e,
                # A replay's call (docs/replays.md): its replay, and the webhook-id it had.
                "replay_id": replay,
                "webhook_id": message_id
                if replay is None
                else replay_webhook_id(message_id, replay),
            }
        )
        if replay is not None:
            continue  # a replay leaves the message's own delivery where it was
        # A failed attempt leaves the message where it was until a move says otherwise.
        location = "delivered" if e["v"] == Verdict.DELIVERED.value else e["tier"]
    return {
        "message_id": message_id,
        "location": location,
        "deliver_at_ms": deliver_at,
        "attempts": attempts,
        "moves": moves,
    }
