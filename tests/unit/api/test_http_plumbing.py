"""Small pure parts of the HTTP layer: validation messages, route labels, health verdicts."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from starlette.routing import Route

from api.health import overall, probe
from api.metrics import ApiMetrics, route_template
from api.responses import describe_validation, error_body


def test_error_body_has_the_design_shape() -> None:
    assert error_body("not_found", "no") == {"error": {"code": "not_found", "message": "no"}}


def test_validation_message_names_each_field() -> None:
    errors = [
        {"loc": ("body", "partitions"), "msg": "Input should be a valid integer"},
        {"loc": ("body", "name"), "msg": "Field required"},
    ]
    assert describe_validation(errors) == (
        "body.partitions: Input should be a valid integer; body.name: Field required"
    )


def test_route_label_is_the_template_not_the_path() -> None:
    route = Route("/v1/projects/{project}", endpoint=lambda request: None)
    assert route_template({"route": route}) == "/v1/projects/{project}"
    assert route_template({}) == "unmatched"


def test_request_metrics_are_rendered() -> None:
    metrics = ApiMetrics()
    metrics.observe_request("POST", "/v1/projects", 201, 0.004)
    text = metrics.render().decode()
    assert 'setu_api_requests_total{method="POST",route="/v1/projects",status="201"} 1.0' in text
    assert "setu_api_request_duration_seconds_bucket" in text


async def test_probe_reports_success_with_latency() -> None:
    async def ok() -> dict[str, Any]:
        return {"brokers": 1}

    result = await probe(ok)
    assert result["ok"] is True
    assert result["brokers"] == 1
    assert result["latency_ms"] >= 0


async def test_probe_turns_failures_and_timeouts_into_not_ok() -> None:
    async def broken() -> dict[str, Any]:
        raise ConnectionError("refused")

    async def slow() -> dict[str, Any]:
        await asyncio.sleep(1)
        return {}

    assert await probe(broken) == {"ok": False, "error": "refused"}
    assert (await probe(slow, timeout_s=0.01))["ok"] is False


@pytest.mark.parametrize(
    ("down", "verdict"),
    [
        ((), (200, "ok")),
        (("kafka",), (503, "degraded")),
        (("database", "ingest"), (503, "degraded")),
        # The ingest job down: reported, but the API still takes messages
        (("ingest",), (200, "degraded")),
    ],
)
def test_health_answers_503_only_when_the_api_cannot_serve(
    down: tuple[str, ...], verdict: tuple[int, str]
) -> None:
    names = ("api", "kafka", "redis", "database", "ingest")
    components = {name: {"ok": name not in down} for name in names}
    assert overall(components) == verdict
