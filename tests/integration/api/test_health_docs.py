"""Health names each dependency; docs and metrics are served."""

from __future__ import annotations

import pytest
import redis

from setu.clock import now_ms
from state import keys
from state.ingest_status import RedisIngestStatus
from tests.integration.api.support import Api

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]


def report_ingest(redis_url: str, **fields: str | int) -> None:
    """Writes the ingest job's report as a running job would."""
    client = redis.Redis.from_url(redis_url)
    try:
        client.delete(keys.ingest_status())
        RedisIngestStatus(client).write(fields)
    finally:
        client.close()


async def test_health_is_ok_and_names_every_component(api: Api, redis_url: str) -> None:
    # Given an ingest job that reports it runs, 12 records behind
    report_ingest(redis_url, state="running", at=now_ms(), since=now_ms(), behind=12)
    response = await api.client.get("/v1/health")
    assert response.status_code == 200, response.text
    report = response.json()
    assert report["status"] == "ok"
    assert set(report["components"]) == {"api", "kafka", "redis", "database", "ingest"}
    assert all(c["ok"] for c in report["components"].values())
    assert report["components"]["kafka"]["brokers"] >= 1
    assert report["components"]["ingest"]["offsets_behind"] == 12


async def test_health_shows_an_ingest_job_that_fails_or_went_silent(
    api: Api, redis_url: str
) -> None:
    # Given an ingest job that failed on a record, then went silent (crash-looping)
    error = "org.apache.kafka.common.errors.RecordTooLargeException: The message is ..."
    report_ingest(redis_url, state="failed", at=now_ms() - 60_000, error=error)
    # When an operator asks for health
    response = await api.client.get("/v1/health")
    # Then the API still serves (200) but says degraded, with the job down and why
    assert response.status_code == 200
    report = response.json()
    assert report["status"] == "degraded"
    ingest = report["components"]["ingest"]
    assert (ingest["ok"], ingest["state"], ingest["error"]) == (False, "down", error)
    report_ingest(redis_url, state="running", at=now_ms())


async def test_openapi_lists_the_design_routes_and_docs_render(api: Api) -> None:
    spec = (await api.client.get("/openapi.json")).json()
    paths = set(spec["paths"])
    for path in (
        "/v1/projects",
        "/v1/projects/{project}",
        "/v1/projects/{project}/topics",
        "/v1/projects/{project}/topics/{topic}",
        "/v1/projects/{project}/topics/{topic}/produce",
        "/v1/projects/{project}/topics/{topic}/produce/batch",
        "/v1/projects/{project}/topics/{topic}/producers/{producer_id}",
        "/v1/projects/{project}/subscriptions",
        "/v1/projects/{project}/subscriptions/{subscription}",
        "/v1/projects/{project}/subscriptions/{subscription}/pause",
        "/v1/health",
    ):
        assert path in paths
    produce = spec["paths"]["/v1/projects/{project}/topics/{topic}/produce"]["post"]
    assert "application/octet-stream" in produce["requestBody"]["content"]
    docs = await api.client.get("/docs")
    assert docs.status_code == 200
    assert "swagger" in docs.text.lower()


async def test_metrics_are_prometheus_text(api: Api) -> None:
    await api.client.get("/v1/health")
    response = await api.client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    assert 'setu_api_requests_total{method="GET",route="/v1/health",status="200"}' in response.text
    assert "setu_api_request_duration_seconds_bucket" in response.text
    assert "setu_api_producer_queue_records" in response.text
