"""Health names each dependency; docs and metrics are served."""

from __future__ import annotations

import pytest
import redis

from setu.clock import now_ms
from state import keys
from state.ingest_status import RedisIngestStatus
from tests.integration.api.support import Api, assert_error

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
    assert report["components"]["redis"]["producer_marks_loaded"] is True
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


async def test_docs_are_served_from_the_package_with_nothing_fetched_elsewhere(api: Api) -> None:
    import re

    page = (await api.client.get("/docs")).text
    # Every script, style and icon the page loads is one of the API's own paths
    assets = re.findall(r"""(?:src|href)=["']([^"']+)["']""", page)
    assert assets and all(a.startswith("/static/") for a in assets), assets
    assert "://" not in "".join(assets)
    for asset in assets:
        served = await api.client.get(asset)
        assert served.status_code == 200 and len(served.content) > 200, asset
    js = await api.client.get("/static/swagger/swagger-ui-bundle.js")
    assert "javascript" in js.headers["content-type"]
    # And the page reads the API's own document, runs no inline script, and keeps no key
    # in the browser's storage
    assert 'data-openapi="/openapi.json"' in page
    assert all(
        script.strip() == "" for script in re.findall(r"<script[^>]*>(.*?)</script>", page, re.S)
    )
    start = (await api.client.get("/static/docs/init.js")).text
    assert "SwaggerUIBundle(" in start and "persistAuthorization" not in start


@pytest.mark.finding("L3")
@pytest.mark.parametrize(
    ("path", "page"),
    [
        ("/docs", True),
        ("/console", True),
        ("/v1/health", False),
        ("/openapi.json", False),
        ("/static/console/console.js", False),
        ("/v1/projects", False),  # a refusal: 401 without a key
    ],
)
async def test_every_answer_carries_the_security_headers(api: Api, path: str, page: bool) -> None:
    answer = await api.client.get(
        path, headers={"Authorization": ""} if path == "/v1/projects" else None
    )
    assert answer.headers["x-content-type-options"] == "nosniff"
    assert answer.headers["referrer-policy"] == "no-referrer"
    assert answer.headers["x-frame-options"] == "DENY"
    policy = answer.headers["content-security-policy"]
    assert "frame-ancestors 'none'" in policy
    if page:
        # Pages load scripts from the API only, and never inline ones
        directives = dict(d.strip().split(" ", 1) for d in policy.split(";"))
        assert directives["script-src"] == "'self'"
        assert directives["connect-src"] == "'self'"
    else:
        assert policy.startswith("default-src 'none'")


async def test_the_document_lists_the_errors_the_api_sends_and_not_422(api: Api) -> None:
    spec = (await api.client.get("/openapi.json")).json()
    operations = [op for ops in spec["paths"].values() for op in ops.values()]
    # No operation documents 422 (invalid requests are 400 in the error shape)
    assert not [op["operationId"] for op in operations if "422" in op["responses"]]
    assert "HTTPValidationError" not in spec["components"]["schemas"]
    # Every operation with a body or query parameters documents its 400
    for op in operations:
        takes_input = "requestBody" in op or any(
            p["in"] == "query" for p in op.get("parameters", [])
        )
        assert not takes_input or "400" in op["responses"], op["operationId"]
    # Health documents its 503 with the same body as its 200
    health = spec["paths"]["/v1/health"]["get"]["responses"]
    assert health["503"]["content"] == health["200"]["content"]


async def test_unknown_or_repeated_query_parameters_are_refused(api: Api, project: str) -> None:
    for query in ("?limt=5", "?x=1&x=2"):
        answer = await api.client.get(f"/v1/projects/{project}/topics{query}")
        assert_error(answer, 400, "invalid_input")
    await api.client.post(f"/v1/projects/{project}/topics", json={"name": "t", "partitions": 1})
    produce = await api.client.post(
        f"/v1/projects/{project}/topics/t/produce?partition=3",
        content=b"x",
        headers={"X_MESSAGE_ID": "m1"},
    )
    assert_error(produce, 400, "invalid_input")


async def test_metrics_are_prometheus_text(api: Api) -> None:
    await api.client.get("/v1/health")
    response = await api.client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    assert 'setu_api_requests_total{method="GET",route="/v1/health",status="200"}' in response.text
    assert "setu_api_request_duration_seconds_bucket" in response.text
    assert "setu_api_producer_queue_records" in response.text
