"""The dashboard and alert rules the chart ships (helm/setu/files): every expression parses
(``promql-parser``), and every metric it reads is exported by the process that should export
it, as that process's own registry reports its families."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import promql_parser
import pytest
import yaml
from prometheus_client import CollectorRegistry

from api.metrics import ApiMetrics
from delivery.metrics import DeliveryMetrics, RunnerFigures
from spark.metrics import IngestMetrics

FILES = Path(__file__).resolve().parents[3] / "helm" / "setu" / "files"
# Series Prometheus makes itself, not any process.
SYNTHETIC = {"up"}


def sample_names(registry: CollectorRegistry) -> set[str]:
    """Every series name a registry exposes: counters with _total, histograms with their
    _bucket, _sum and _count."""
    names: set[str] = set()
    for family in registry.collect():
        if family.type == "counter":
            names |= {family.name + "_total", family.name + "_created"}
        elif family.type == "histogram":
            names |= {family.name + s for s in ("_bucket", "_sum", "_count")}
        else:
            names.add(family.name)
    return names


def exported() -> dict[str, set[str]]:
    """Per process prefix, what it exports once it has seen some of everything."""
    api = ApiMetrics()
    delivery = DeliveryMetrics()
    delivery.subscription("p", "s").reparked()
    delivery.watch(lambda: [RunnerFigures("p", "s", 1, 0, 0, 0, 0, 0, int(time.time() * 1000))])
    ingest = IngestMetrics()
    ingest.batch_written({"setu.p.t.ingest": (1, 0)}, 0.1)
    ingest.watch(lambda: (True, {"sources": [{"metrics": {"maxOffsetsBehindLatest": "3"}}]}))
    return {
        "setu_api_": sample_names(api.registry),
        "setu_delivery_": sample_names(delivery.registry),
        "setu_ingest_": sample_names(ingest.registry),
    }


def selectors(node: Any) -> Iterator[str]:
    """The metric names an expression's selectors read."""
    if type(node).__name__ == "VectorSelector" and node.name:
        yield node.name
    for attribute in ("lhs", "rhs", "expr", "param", "vector_selector"):
        child = getattr(node, attribute, None)
        if child is not None and hasattr(child, "prettify"):
            yield from selectors(child)
    for child in getattr(node, "args", None) or ():
        yield from selectors(child)


def rules() -> list[dict[str, Any]]:
    document = yaml.safe_load((FILES / "alerts.yaml").read_text())
    return [rule for group in document["groups"] for rule in group["rules"]]


def dashboard_expressions() -> list[str]:
    dashboard = json.loads((FILES / "dashboard.json").read_text())
    return [
        target["expr"].replace("$__rate_interval", "5m")
        for panel in dashboard["panels"]
        for target in panel.get("targets", ())
    ]


def check(expr: str, exports: dict[str, set[str]]) -> None:
    names = list(selectors(promql_parser.parse(expr)))
    assert names, f"{expr!r} reads no metric"
    for name in names:
        if name in SYNTHETIC:
            continue
        owner = next((p for p in exports if name.startswith(p)), None)
        assert owner is not None, f"{name} (in {expr!r}) belongs to no Setu process"
        assert name in exports[owner], f"{name} (in {expr!r}) is not exported by {owner}*"


@pytest.mark.parametrize("rule", rules(), ids=lambda r: str(r["alert"]))
def test_every_alert_parses_reads_exported_metrics_and_says_what_to_do(
    rule: dict[str, Any],
) -> None:
    check(rule["expr"], exported())
    assert rule["labels"]["severity"] in {"critical", "warning", "info"}
    assert rule["annotations"]["summary"] and rule["annotations"]["description"]


def test_every_dashboard_panel_parses_and_reads_exported_metrics() -> None:
    exports = exported()
    expressions = dashboard_expressions()
    assert len(expressions) >= 12
    for expr in expressions:
        check(expr, exports)


def test_a_metric_that_does_not_exist_is_caught() -> None:
    with pytest.raises(AssertionError, match="not exported"):
        check("rate(setu_delivery_no_such_thing_total[5m])", exported())
