"""The Helm chart's static structure: what every template says once its directives are dropped.

Rendering needs the `helm` binary, which Debian does not package; these tests read the parts
of each template that are plain YAML, so probes, hooks and defaults are checked everywhere.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from setu.settings import Settings

CHART = Path(__file__).resolve().parents[3] / "helm" / "setu"
TEMPLATES = sorted((CHART / "templates").glob("*.yaml"))

_COMMENT = re.compile(r"\{\{-?\s*/\*.*?\*/\s*-?\}\}", re.DOTALL)
_INLINE = re.compile(r"\{\{.*?\}\}")


def static_yaml(template: str) -> list[dict[str, Any]]:
    """The documents of a template with directive-only lines removed and values stubbed."""
    text = _COMMENT.sub("", template)
    lines = []
    for line in text.splitlines():
        if line.strip() and _INLINE.sub("", line).strip() == "":
            continue  # a line of directives only
        lines.append(_INLINE.sub("TEMPLATE", line))
    return [doc for doc in yaml.safe_load_all("\n".join(lines)) if doc]


def documents() -> list[dict[str, Any]]:
    return [doc for path in TEMPLATES for doc in static_yaml(path.read_text())]


def workload(suffix: str) -> dict[str, Any]:
    (found,) = [
        d
        for d in documents()
        if d["kind"] in ("Deployment", "Job") and d["metadata"]["name"].endswith(suffix)
    ]
    return found


def container(doc: dict[str, Any]) -> dict[str, Any]:
    (only,) = doc["spec"]["template"]["spec"]["containers"]
    return only


@pytest.mark.parametrize("path", TEMPLATES, ids=lambda p: p.name)
def test_every_template_is_yaml_with_kubernetes_objects(path: Path) -> None:
    for doc in static_yaml(path.read_text()):
        assert doc["apiVersion"]
        assert doc["kind"]
        assert doc["metadata"]["name"]


def test_the_chart_has_api_delivery_ingest_and_migrations() -> None:
    names = {d["metadata"]["name"] for d in documents()}
    assert any(n.endswith("-api") for n in names)
    assert any(n.endswith("-delivery") for n in names)
    assert any(n.endswith("-ingest") for n in names)
    assert any(n.endswith("-migrate") for n in names)


def test_each_process_runs_its_setu_sub_command() -> None:
    for suffix, command in (
        ("-api", "api"),
        ("-delivery", "deliver"),
        ("-ingest", "ingest"),
        ("-migrate", "migrate"),
    ):
        spec = container(workload(suffix))
        assert spec["command"] == ["setu"]
        assert spec["args"] == [command]


def test_the_api_is_ready_only_when_healthy_and_scraped_by_prometheus() -> None:
    api = workload("-api")
    probe = container(api)["readinessProbe"]["httpGet"]
    assert probe["path"] == "/v1/health"
    annotations = api["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/path"] == "/metrics"


def test_delivery_workers_are_probed_through_their_heartbeat() -> None:
    spec = container(workload("-delivery"))
    for probe in ("readinessProbe", "livenessProbe"):
        assert spec[probe]["exec"]["command"] == ["setu", "deliver", "--check"]
    worker_id = {e["name"]: e for e in spec["env"]}["SETU_WORKER_ID"]
    assert worker_id["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"


@pytest.mark.parametrize(("component", "port"), [("delivery", 9464), ("ingest", 9465)])
def test_workers_and_the_ingest_job_serve_metrics_that_prometheus_scrapes(
    component: str, port: int
) -> None:
    # Given the component's workload and the chart's defaults
    doc = workload(f"-{component}")
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    # Then each pod serves /metrics on every interface, on a named port, and is scraped
    spec = container(doc)
    env = {e["name"]: e.get("value") for e in spec["env"]}
    assert env[f"SETU_{component.upper()}_METRICS_HOST"] == "0.0.0.0"
    assert f"SETU_{component.upper()}_METRICS_PORT" in env
    assert [p["name"] for p in spec["ports"]] == ["metrics"]
    annotations = doc["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/path"] == "/metrics"
    assert values[component]["metrics"] == {"scrape": True, "port": port}


def test_the_ingest_job_never_runs_twice_on_one_checkpoint() -> None:
    ingest = workload("-ingest")
    assert ingest["spec"]["replicas"] == 1
    assert ingest["spec"]["strategy"]["type"] == "Recreate"
    env = {e["name"] for e in container(ingest)["env"]}
    assert {"SETU_SPARK_MASTER", "SETU_SPARK_CHECKPOINT_DIR"} <= env


def test_migrations_run_before_install_and_upgrade() -> None:
    job = workload("-migrate")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    # Its settings exist before it does: hook copies with a lower weight.
    weights = {
        d["kind"]: int(d["metadata"]["annotations"]["helm.sh/hook-weight"])
        for d in documents()
        if "helm.sh/hook" in d["metadata"].get("annotations", {})
    }
    assert weights["ConfigMap"] < weights["Job"]
    assert weights["Secret"] < weights["Job"]


def test_private_webhooks_are_refused_by_default() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["config"]["SETU_ALLOW_PRIVATE_ENDPOINTS"] == "false"


def test_the_api_head_timeout_is_a_value_with_the_settings_default() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["config"]["SETU_HTTP_HEAD_TIMEOUT_MS"] == str(Settings().http_head_timeout_ms)


def test_every_kafka_security_setting_is_a_value_and_passwords_are_secrets() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    fields = [
        name for name in Settings.model_fields if name.startswith(("kafka_sasl_", "kafka_ssl_"))
    ]
    wanted = {f"SETU_{name.upper()}" for name in [*fields, "kafka_security_protocol"]}
    secret = {name for name in wanted if name.endswith("_PASSWORD")}
    assert secret == {"SETU_KAFKA_SASL_PASSWORD", "SETU_KAFKA_SSL_KEY_PASSWORD"}
    assert secret <= set(values["secrets"])
    assert wanted - secret <= set(values["config"])
    assert not secret & set(values["config"])
    # Clients speak PLAINTEXT unless told otherwise, as Setu does outside the chart
    assert values["config"]["SETU_KAFKA_SECURITY_PROTOCOL"] == Settings().kafka_security_protocol


def test_redis_behind_sentinel_is_a_value_and_its_password_a_secret() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["config"]["SETU_REDIS_SENTINELS"] == ""  # one Redis unless set
    assert values["config"]["SETU_REDIS_SENTINEL_MASTER"] == Settings().redis_sentinel_master
    assert "SETU_REDIS_SENTINEL_PASSWORD" in values["secrets"]
    assert "SETU_REDIS_SENTINEL_PASSWORD" not in values["config"]
    # And parked dead letters are kept for ever unless the operator says otherwise
    assert values["config"]["SETU_DEAD_LETTER_RETENTION_HOURS"] == ""


def test_egress_proxies_are_secrets_the_settings_read() -> None:
    # Their URLs may carry a proxy's credentials (docs/security.md §4)
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    for name in ("SETU_EGRESS_PROXY", "SETU_EGRESS_PROXIES"):
        assert name in values["secrets"] and name not in values["config"]
        assert name.removeprefix("SETU_").lower() in Settings.model_fields


def test_chart_metadata() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2"
    assert chart["name"] == "setu"


def test_every_api_pod_serves_streaming_produce_on_its_service() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["api"]["stream"] == {"enabled": True, "port": 8070, "servicePort": 8070}
    spec = container(workload("-api"))
    assert "SETU_STREAM_PORT" in {e["name"] for e in spec["env"]}
    assert "stream" in {p["name"] for p in spec["ports"]}
    (service,) = [
        d for d in documents() if d["kind"] == "Service" and d["metadata"]["name"].endswith("-api")
    ]
    assert {"name": "stream", "port": "TEMPLATE", "targetPort": "stream"} in service["spec"][
        "ports"
    ]
