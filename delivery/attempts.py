"""Each message's delivery record (docs/design.md §9): every attempt and every move between
tiers, as operators read it through ``GET .../messages/{id}``.

The runner tells an :class:`AttemptRecorder` of each call (when, from which tier, the status or
error, how long, the start of a failed answer's body) and of each move (to which tier, why).
The recorder only appends to a buffer; the runner flushes it to the attempt log every
:data:`FLUSH_MS` in one write. The log is diagnostic: when Redis does not take a flush the
entries are kept for the next one, up to :data:`MAX_BUFFERED`, then the oldest are dropped
and counted (``setu_delivery_attempt_log_dropped_total``), never holding delivery back.

:func:`state.attempt_log.delivery_record` turns the entries into the view.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

import orjson
from redis.exceptions import RedisError

from setu.ordering.groups import Kind
from setu.ordering.records import Record
from setu.ordering.tiers import tier_name
from setu.outcome import Outcome
from state.attempt_log import AttemptLog, Entry

log = logging.getLogger(__name__)

FLUSH_MS = 200
MAX_BUFFERED = 100_000


class AttemptRecorder:
    def __init__(
        self, log_: AttemptLog, on_dropped: Callable[[int], None] = lambda n: None
    ) -> None:
        self._log = log_
        self._on_dropped = on_dropped
        self._buffer: list[Entry] = []

    def called(
        self,
        record: Record,
        number: int,
        outcome: Outcome,
        at_ms: int,
        ms: float,
        replay: str | None = None,
    ) -> None:
        """One call; ``replay``: the replay it belonged to (docs/replays.md)."""
        entry: dict[str, Any] = {
            "t": at_ms,
            "a": number,
            "tier": tier_name(record.tier),
            "v": outcome.verdict.value,
            "ms": round(ms, 1),
        }
        if replay is not None:
            entry["r"] = replay
        if outcome.status is not None:
            entry["s"] = outcome.status
        if outcome.error is not None:
            entry["e"] = outcome.error
        if outcome.excerpt:
            entry["x"] = outcome.excerpt
        if outcome.given_back:
            entry["g"] = 1
        self._buffer.append((record.envelope.message_id, orjson.dumps(entry)))

    def moved(self, sources: Iterable[Record], target: int, kind: Kind, at_ms: int) -> None:
        line = orjson.dumps({"t": at_ms, "to": tier_name(target), "k": kind.value})
        self._buffer.extend((r.envelope.message_id, line) for r in sources)

    def filtered(self, record: Record, at_ms: int) -> None:
        """The subscription's filter turned the message away (docs/policies.md §1)."""
        self._buffer.append((record.envelope.message_id, orjson.dumps({"t": at_ms, "f": 1})))

    def scheduled(self, record: Record, at_ms: int) -> None:
        """The message waits for the time its producer chose (docs/scheduling.md)."""
        line = orjson.dumps({"t": at_ms, "sched": record.envelope.deliver_at_ms})
        self._buffer.append((record.envelope.message_id, line))

    def unscheduled(self, message_id: str, group: str, why: str, at_ms: int) -> None:
        """A scheduled message finished without a call: ``cancelled`` or ``gone``."""
        self._buffer.append((message_id, orjson.dumps({"t": at_ms, "u": why})))

    @property
    def empty(self) -> bool:
        return not self._buffer

    def flush_tick(self) -> Coroutine[Any, Any, None] | None:
        """:meth:`flush` as periodic work: None with nothing to write."""
        return self.flush() if self._buffer else None

    async def flush(self) -> None:
        if not self._buffer:
            return
        batch, self._buffer = self._buffer, []
        try:
            await self._log.append(batch)
        except (RedisError, OSError) as exc:
            kept = (batch + self._buffer)[-MAX_BUFFERED:]
            dropped = len(batch) + len(self._buffer) - len(kept)
            self._buffer = kept
            if dropped:
                self._on_dropped(dropped)
            log.warning("attempt log not written (%s): %d entries kept for later", exc, len(kept))
