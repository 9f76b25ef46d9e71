"""``GET /v1/health``: 200 when the API, Kafka, Redis and the database all answer, else 503.

Each component is probed concurrently with a short timeout and reported on its own:
``{"status": "ok"|"degraded", "components": {"kafka": {"ok": true, "latency_ms": 3.1,
"brokers": 1}, "redis": {...}, "database": {...}, "api": {...}, "ingest": {...}}}``.

``redis`` says whether it holds the producer marks (``producer_marks_loaded``); ``ingest`` is
the ingest job's own report (:mod:`state.ingest_status`): its state, lag and
last failure. A job that is down or failing makes the status word ``degraded`` but not the
answer 503: the API still takes messages (they wait in the ingest topics), and a readiness
probe must not take API replicas out of service for it. ``GET /metrics`` serves the
Prometheus registry.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, Literal

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict
from starlette.responses import Response

from api.context import Services, blocking, services
from api.responses import JSON
from setu.clock import now_ms
from state.ingest_status import ingest_view

router = APIRouter(tags=["health"])

PROBE_TIMEOUT_S = 2.0

Probe = Callable[[], Awaitable[dict[str, Any]]]


async def probe(check: Probe, timeout_s: float = PROBE_TIMEOUT_S) -> dict[str, Any]:
    """Runs one check; never raises: a failure or a timeout becomes ``ok: false``."""
    started = time.perf_counter()
    try:
        details = await asyncio.wait_for(check(), timeout_s)
    except TimeoutError:
        return {"ok": False, "error": f"no answer within {timeout_s} s"}
    except Exception as exc:  # a health probe reports every failure instead of raising it
        return {"ok": False, "error": str(exc) or type(exc).__name__}
    latency_ms = round((time.perf_counter() - started) * 1000, 2)
    return {"ok": True, "latency_ms": latency_ms, **details}


# What the API needs to serve requests: 503 when one of these does not answer.
SERVING = ("api", "kafka", "redis", "database")


def overall(components: dict[str, dict[str, Any]]) -> tuple[int, str]:
    """HTTP status and summary word of a health report (see the module doc)."""
    serving = all(components[name]["ok"] for name in SERVING if name in components)
    everything = all(c["ok"] for c in components.values())
    return (200 if serving else 503), ("ok" if everything else "degraded")


def _probes(s: Services) -> dict[str, Probe]:
    async def kafka() -> dict[str, Any]:
        brokers = await blocking(s.kafka_admin.broker_count, PROBE_TIMEOUT_S)
        return {"brokers": brokers, "producer_queue": len(s.producer)}

    async def redis() -> dict[str, Any]:
        await s.redis.answers()
        # False after Redis forgot the producer marks, until the ingest job published them
        # again: GET …/producers/{id} answers 503 meanwhile (docs/design.md §4).
        return {"producer_marks_loaded": await s.redis.marks_loaded()}

    async def database() -> dict[str, Any]:
        await blocking(s.store.ping)
        return {}

    async def api() -> dict[str, Any]:
        return {}

    async def ingest() -> dict[str, Any]:
        view = await ingest_state(s)
        view.pop("topic_lags", None)  # per topic in each subscription's status
        view.pop("reading_topics", None)
        return view

    return {"api": api, "kafka": kafka, "redis": redis, "database": database, "ingest": ingest}


async def ingest_state(s: Services) -> dict[str, Any]:
    """The ingest job's report as :func:`state.ingest_status.ingest_view` reads it."""
    return ingest_view(await s.redis.ingest_status(), now_ms())


class ComponentOut(BaseModel):
    """One component's probe: ``ok``, and its latency or its error, plus what it reports."""

    model_config = ConfigDict(extra="allow")

    ok: bool
    latency_ms: float | None = None
    error: str | None = None


class HealthOut(BaseModel):
    status: Literal["ok", "degraded"]
    components: dict[str, ComponentOut]


@router.get(
    "/v1/health",
    response_model=None,
    summary="State of the API and its dependencies",
    responses={
        200: {"model": HealthOut, "description": "the API, Kafka, Redis and the database answer"},
        503: {"model": HealthOut, "description": "one of them does not: see its component"},
    },
)
async def health(request: Request) -> Response:
    checks = _probes(services(request))
    results = await asyncio.gather(*(probe(check) for check in checks.values()))
    components = dict(zip(checks, results, strict=True))
    status, word = overall(components)
    return JSON({"status": word, "components": components}, status_code=status)


@router.get("/metrics", response_model=None, include_in_schema=False)
async def metrics(request: Request) -> Response:
    registry = services(request).metrics
    return Response(registry.render(), media_type=registry.content_type)
