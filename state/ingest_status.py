"""The ingest job's state as the rest of Setu sees it: written by the job, read by the API
(``GET /v1/health``, each subscription's status) and by ``setu dev up``.

The job writes one Redis hash (``state.keys.ingest_status``) every couple of seconds and at
each change: ``state`` (``starting``, ``running``, ``failed``, ``stopped``), ``at`` (its
heartbeat, epoch ms), ``since`` (when that state began), ``behind`` (records the furthest-behind
ingest partition had still to read after the last batch), ``last_batch`` (epoch ms) and
``error`` (the root cause of the last failure, until a batch is written again) and ``lags``
(JSON: per ingest topic, records still to read after the last batch).
:func:`ingest_view` turns that into what readers show; a heartbeat older than
:data:`STALE_MS` means the job is not running at all (killed, or crash-looping).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import redis

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
    }
    if state != "stopped" and now_ms - at > STALE_MS:
        view["state"] = "down"
        view["error"] = f"no heartbeat for {(now_ms - at) // 1000} s"
    if fields.get("error"):
        view["error"] = fields["error"]
    view["ok"] = view["state"] == "running"
    return view


def write_status(client: redis.Redis[bytes], fields: Mapping[str, str | int]) -> None:
    """Merges ``fields`` into the job's status hash (the job's side); an empty ``error``
    removes the last failure."""
    key = keys.ingest_status()
    mapping: dict[str | bytes, str | int] = {k: v for k, v in fields.items() if k != "error"}
    if "error" in fields and not fields["error"]:
        client.hdel(key, "error")
    elif "error" in fields:
        mapping["error"] = fields["error"]
    client.hset(key, mapping=mapping)


def read_status(client: redis.Redis[bytes]) -> dict[str, str]:
    return decoded(client.hgetall(keys.ingest_status()))


def decoded(raw: Mapping[bytes, bytes]) -> dict[str, str]:
    """The status hash as Redis returns it, as text."""
    return {k.decode(): v.decode() for k, v in raw.items()}
