"""One Redis round trip a second for the whole worker, so an idle subscription costs no Redis
round trip of its own (docs/delivery.md, "What an idle subscription costs").

Each runner used to ask Redis every second, for every partition it owns, whether Redis still
holds what it wrote (``DurableGroupStore.verify``: a server that restarted empty, a replica
promoted before it had the last writes, keys restored from an older snapshot) and whether an
operator asked for groups or dead letters to be released. With a hundred subscriptions that
was hundreds of round trips a second from a worker doing nothing. :class:`StateWatch` reads
all of it in one request a second, on a Redis connection of its own (``worker.serve``): in the
runners' shared pool it waited behind their commands under load, went stale, and every runner
then asked Redis itself, which loaded the pool further:

- per watched partition, the owner epoch and write count Redis holds, beside the count its
  owner made, sampled just before the read (the rule of ``DurableGroupStore.verify``); the
  runner compares them at its next tick and raises ``StateLost`` as before;
- per watched subscription, the breaker its workers share (``docs/policies.md`` §2), which
  the runner's policy check adopts instead of reading it itself;
- the count of changes made to subscriptions' records (by the API, or a worker's policy),
  so that the worker lists them at once when it moved (a new subscription's first delivery
  waits a second for this, not a listing interval);
- per watched subscription, its release version (``state.keys.release_version``), which
  ``RedisGroupStore.request_release`` raises in the same transaction as the request; the
  runner polls its releases when the version moved, when its partitions changed, and every
  ``BACKSTOP_MS`` whatever the version says.

A reading that finds any of these moved for a subscription tells its runner
(``Watched.changed``), whose resting works (the release poll, the policy check) then look at
once: resting, they look on their own only every few seconds.

While an entry's last reading is older than ``STALE_S`` (Redis away, the watch's task gone),
its runner asks Redis itself every tick, as it did before: the watch only takes work away.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson
from redis.asyncio import Redis

from state.groups import RepeatedRead, parse_reading, read_subscriptions

log = logging.getLogger(__name__)

EVERY_S = 1.0
_NOTHING: Mapping[int, tuple[int, int]] = {}
# Past this since its last reading an entry says nothing: its runner asks Redis itself.
STALE_S = 5.0
# How often a runner polls its releases even when the version did not move (a release the
# version did not count: none is known, since the request raises it in its own transaction).
# Every 30 s, a thousand runners' polls were a twentieth of an idle worker's CPU.
BACKSTOP_MS = 300_000


class Verifiable(Protocol):
    """A group store whose owner can tell whether Redis lost its writes (state/durable_groups)."""

    def written(self) -> Mapping[int, tuple[int, int]]:
        """Per partition owned: (owner epoch, writes made since the claim)."""
        ...

    def check_held(self, partition: int, epoch: int, made: int, held: tuple[int, int]) -> None:
        """Raises ``StateLost`` when ``held`` (Redis's epoch and count, read after ``made``
        was counted under ``epoch``) shows writes lost."""


@dataclass(eq=False)
class Watched:
    """One runner's entry: what the last reading found for its subscription."""

    project: str
    subscription: str
    store: Verifiable | None
    version: int | None = None
    breaker: dict[str, Any] | None = None
    # (partition, epoch, writes made, (epoch, writes) Redis held)
    checks: list[tuple[int, int, int, tuple[int, int]]] = field(default_factory=list)
    read_at: float = -math.inf  # monotonic seconds
    # The last reading's raw values and this owner's figures sampled before it: a reading
    # equal to both changes nothing and is not parsed again.
    raw: list[bytes | None] | None = None
    written: Mapping[int, tuple[int, int]] | None = None
    # The partitions of the last figures sampled (the store gives the same mapping while
    # they do not change): not sorted again each second.
    _sampled: Mapping[int, tuple[int, int]] | None = None
    _partitions: list[int] = field(default_factory=list)
    # Told when a reading found something moved (a release requested, the shared breaker's
    # word, Redis's figures of the owner's writes): the runner's resting works look at once.
    changed: Callable[[], None] | None = None

    def partitions_of(self, written: Mapping[int, tuple[int, int]]) -> list[int]:
        if written is not self._sampled:
            self._sampled, self._partitions = written, sorted(written)
        return self._partitions

    def fresh(self) -> bool:
        return time.monotonic() - self.read_at < STALE_S

    def verify(self) -> None:
        """Raises ``StateLost`` when the last reading found Redis without this owner's writes."""
        if self.store is not None:
            for partition, epoch, made, held in self.checks:
                self.store.check_held(partition, epoch, made, held)


class StateWatch:
    """The worker's one reading of Redis a second (see the module doc)."""

    def __init__(self, client: Redis[bytes], every_s: float = EVERY_S) -> None:
        self._client = client
        self._repeated = RepeatedRead()
        self._every_s = every_s
        self._entries: set[Watched] = set()
        # Set when the API's change count of subscriptions moved (``keys.subscriptions_changed``):
        # the worker lists them at once (``Worker.run``) and clears it.
        self.subscriptions_changed = asyncio.Event()
        self._changes: int | None = None

    def watch(self, project: str, subscription: str, store: Verifiable | None) -> Watched:
        entry = Watched(project, subscription, store)
        self._entries.add(entry)
        return entry

    def forget(self, entry: Watched) -> None:
        self._entries.discard(entry)

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.read()
            except Exception as exc:  # Redis away: the runners ask on their own meanwhile
                log.debug("state watch: %r", exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self._every_s)

    async def read(self) -> None:
        """One pipeline: the subscriptions' change count, and every entry's release version,
        breaker and partitions' owner figures."""
        # Counted before Redis is read (DurableGroupStore.verify says why).
        samples = [(e, e.store.written() if e.store else _NOTHING) for e in self._entries]
        asked = [e.partitions_of(written) for e, written in samples]
        changes, raws = await read_subscriptions(
            self._client,
            [(e.project, e.subscription, p) for (e, _), p in zip(samples, asked, strict=True)],
            self._repeated,
        )
        if self._changes is not None and changes != self._changes:
            self.subscriptions_changed.set()
        self._changes = changes
        now = time.monotonic()
        for (entry, written), partitions, raw in zip(samples, asked, raws, strict=True):
            entry.read_at = now
            if raw == entry.raw and written == entry.written:
                continue  # nothing moved since the last reading: what it found stands
            reading = parse_reading(raw, partitions)
            entry.checks = [
                (partition, *written[partition], held) for partition, held in reading.held.items()
            ]
            entry.version = reading.release_version
            word = reading.breaker
            entry.breaker = None if word is None else dict(orjson.loads(word))
            entry.raw, entry.written = raw, written
            if entry.changed is not None:
                entry.changed()
