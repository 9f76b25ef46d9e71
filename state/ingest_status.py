"""The ingest job's state as the rest of Setu sees it: written by the job, read by the API
(``GET /v1/health``, each subscription's status) and by ``setu dev up``.

The job writes one Redis hash (``state.keys.ingest_status``) every couple of seconds and at
each change: ``state`` (``starting``, ``running``, ``failed``, ``stopped``), ``at`` (its
heartbeat, epoch ms), ``since`` (when that state began), ``behind`` (records the furthest-behind
ingest partition had still to read after the last batch), ``last_batch`` (epoch ms) and
``error`` (the root cause of the last failure, until a batch is written again), ``lags``
(JSON: per ingest topic, records still to read after the last batch) and ``reading`` (JSON: the
ingest topics the running query reads).
:func:`ingest_view` turns that into what readers show; a heartbeat older than
:data:`STALE_MS` means the job is not running at all (killed, or crash-looping).

Contract (:class:`RedisIngestStatus` and :class:`StubIngestStatus`, the same tests on both):
:meth:`~IngestStatus.write` merges fields into the report, an empty ``error`` removes the
last failure; :meth:`~IngestStatus.read` returns the report as text. The API reads it with
:func:`read_status_async` on its own event loop.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Protocol

import redis
import redis.asyncio

from state import keys

STALE_MS = 15_000


def ingest_view(fields: Mapping[str, str], now_ms: int) -> dict[str, Any]:
    """``{"state", "ok", "since_ms", "offsets_behind", "last_batch_at_ms", "error"}``; state
    ``unknown`` when the job never wrote, ``down`` when its heartbeat is stale."""
    if not fields:
        return {"state": "unknown", "ok": False, "error": "the ingest job has not reported"}
    state = fields.get("state", "unknown")
    at = int(fields.get("at") or 0)
    view: dict[str, Any] = {
        "state": state,
        "since_ms": int(fields.get("since") or 0) or None,
        "offsets_behind": int(fields["behind"]) if fields.get("behind") else None,
        "last_batch_at_ms": int(fields.get("last_batch") or 0) or None,
        "topic_lags": json.loads(fields["lags"]) if fields.get("lags") else {},
        "reading_topics": json.loads(fields["reading"]) if fields.get("reading") else None,
    }
    if state != "stopped" and now_ms - at > STALE_MS:
        view["state"] = "down"
        view["error"] = f"no heartbeat for {(now_ms - at) // 1000} s"
    if fields.get("error"):
        view["error"] = fields["error"]
    view["ok"] = view["state"] == "running"
    return view


class IngestStatus(Protocol):
    def write(self, fields: Mapping[str, str | int]) -> None:
        """Merges ``fields`` into the report; an empty ``error`` removes the last failure."""

    def read(self) -> dict[str, str]: ...


class RedisIngestStatus:
    """The report as one Redis hash (``state.keys.ingest_status``)."""

    def __init__(self, client: redis.Redis[bytes]) -> None:
        self._client = client

    def write(self, fields: Mapping[str, str | int]) -> None:
        key = keys.ingest_status()
        mapping: dict[str | bytes, str | int] = {k: v for k, v in fields.items() if k != "error"}
        if "error" in fields and not fields["error"]:
            self._client.hdel(key, "error")
        elif "error" in fields:
            mapping["error"] = fields["error"]
        self._client.hset(key, mapping=mapping)

    def read(self) -> dict[str, str]:
        return _decoded(self._client.hgetall(keys.ingest_status()))


class StubIngestStatus:
    """In memory."""

    def __init__(self) -> None:
        self.fields: dict[str, str] = {}

    def write(self, fields: Mapping[str, str | int]) -> None:
        for name, value in fields.items():
            if name == "error" and not value:
                self.fields.pop("error", None)
            else:
                self.fields[name] = str(value)

    def read(self) -> dict[str, str]:
        return dict(self.fields)


async def read_status_async(client: redis.asyncio.Redis[bytes]) -> dict[str, str]:
    """:meth:`RedisIngestStatus.read` for a caller on an event loop (the API)."""
    return _decoded(await client.hgetall(keys.ingest_status()))


def _decoded(raw: Mapping[bytes, bytes]) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in raw.items()}
