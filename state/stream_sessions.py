"""What streaming produce keeps in Redis: one writer per stream, and where each stream stands.

**Leases.** A session that opens the stream ``{project}/{topic}/{producer}`` takes the key
``keys.stream_lease(...)`` with ``SET NX PX`` and its own random token, renews it while the
stream is open, and deletes it (only if it still holds it) once every write it started has
been reported by Kafka. Another session, on this API replica or another, that notifies the
stream meanwhile is refused (docs/streaming.md, "One writer per stream"). A token starts with
its replica's id (host name and stream port): a replica that starts again frees the leases its
last run left, since none of that run's writes can still be in flight. A replica that dies for
good holds its streams until the leases' TTL runs out.

**Stream points.** For each producer, the highest sequence id such that it and every sequence the
session sent below it were acknowledged by Kafka in the ingest topic, stored as
``"<topic incarnation>:<sequence>"`` and raised with the producer marks' own script
(state/producer_marks.py), so it never goes backwards and a deleted topic's point does not
count for the topic created again. The point a new session resumes from is one more than this
point. Only a stream never written by a session (or whose point Redis lost) resumes from the
producer mark that ingest keeps instead: that mark is the highest sequence ingest accepted from
any partition, and a replica that died with writes in flight to several partitions can leave a
later sequence in Kafka and an earlier one lost, so the mark is no point below which everything
is durable (docs/streaming.md, "Points of reference").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from redis.asyncio import Redis

from state import keys
from state.producer_marks import (
    MARKS_UNAVAILABLE,
    NO_SEQUENCE,
    RAISE_MARKS,
    MarksUnavailable,
    last_sequence,
)

StreamKey = tuple[str, str, str]
"""(project, topic, producer id)"""

# KEYS = leases; ARGV[i] = the token that holds KEYS[i], ARGV[#KEYS + 1] = ttl in ms. Returns 1
# per key still held by its token, else 0.
_RENEW_EACH = """
local ttl = ARGV[#KEYS + 1]
local held = {}
for i = 1, #KEYS do
  if redis.call('GET', KEYS[i]) == ARGV[i] then
    redis.call('PEXPIRE', KEYS[i], ttl)
    held[i] = 1
  else
    held[i] = 0
  end
end
return held
"""

# KEYS = leases; ARGV[1] = token prefix. Deletes the leases whose token starts with it.
_RELEASE_PREFIXED = """
local freed = 0
for i = 1, #KEYS do
  local token = redis.call('GET', KEYS[i])
  if token and string.sub(token, 1, #ARGV[1]) == ARGV[1] then
    redis.call('DEL', KEYS[i])
    freed = freed + 1
  end
end
return freed
"""

# KEYS[1] = lease; ARGV[1] = token
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


class StreamSessions:
    """Leases and stream points (see the module doc); every call is one Redis round trip."""

    def __init__(self, client: Redis[bytes], lease_ms: int) -> None:
        self._client = client
        self.lease_ms = lease_ms
        self._renew_each = client.register_script(_RENEW_EACH)
        self._release = client.register_script(_RELEASE)
        self._release_prefixed = client.register_script(_RELEASE_PREFIXED)
        self._raise = client.register_script(RAISE_MARKS)

    async def acquire(self, stream: StreamKey, token: str) -> bool:
        """True when this session now writes ``stream``; False while another session does."""
        taken = await self._client.set(keys.stream_lease(*stream), token, nx=True, px=self.lease_ms)
        return bool(taken)

    async def renew_each(self, held: Sequence[tuple[StreamKey, str]]) -> list[bool]:
        """Extends each lease its session's token still holds, for many sessions at once:
        each (stream, the token of the session that holds it); False for each one it lost."""
        if not held:
            return []
        leases = [keys.stream_lease(*stream) for stream, _ in held]
        tokens: list[str | int] = [token for _, token in held]
        answer = await self._renew_each(keys=leases, args=[*tokens, self.lease_ms])
        return [bool(h) for h in answer]

    async def release(self, stream: StreamKey, token: str) -> None:
        await self._release(keys=[keys.stream_lease(*stream)], args=[token])

    async def release_replica(self, replica: str) -> int:
        """Frees every lease whose token starts with ``replica`` + ``/``: this replica's last
        run. Returns how many were freed."""
        freed = 0
        batch: list[bytes] = []
        async for key in self._client.scan_iter(match=keys.stream_lease_pattern(), count=500):
            batch.append(key)
            if len(batch) == 500:
                freed += int(await self._release_prefixed(keys=batch, args=[f"{replica}/"]))
                batch = []
        if batch:
            freed += int(await self._release_prefixed(keys=batch, args=[f"{replica}/"]))
        return freed

    async def resume_point(self, stream: StreamKey, incarnation: int) -> int:
        """The point a session of ``stream`` resumes from: every lower sequence is durable."""
        project, topic, producer = stream
        async with self._client.pipeline(transaction=False) as pipe:
            pipe.hget(keys.producer_marks(project, topic), producer)
            pipe.hget(keys.stream_points(project, topic), producer)
            pipe.exists(keys.producer_marks_loaded())
            mark, point, loaded = await pipe.execute()
        if not loaded:
            raise MarksUnavailable(MARKS_UNAVAILABLE)
        durable = last_sequence(point, incarnation)
        if durable == NO_SEQUENCE:
            durable = last_sequence(mark, incarnation)
        return durable + 1

    async def record(
        self, project: str, topic: str, durable: Mapping[str, tuple[int, int]]
    ) -> None:
        """Raises each producer's stream point to (incarnation, highest durable sequence)."""
        args: list[str | int] = []
        for producer, (incarnation, sequence) in durable.items():
            args += [producer, incarnation, sequence]
        if args:
            await self._raise(keys=[keys.stream_points(project, topic)], args=args)
