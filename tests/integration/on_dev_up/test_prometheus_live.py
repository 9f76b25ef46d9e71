"""A real Prometheus (Debian's) scrapes a running `setu dev up` stack: the chart's alert rules
load, the parked-groups alert fires in Prometheus's own API when a group is parked on purpose,
and every query of the chart's dashboard returns data from it."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from cli.ports import any_free_port
from tests.integration.on_dev_up.support import DevStack
from tests.waiting import wait_for

pytestmark = pytest.mark.integration

FILES = Path(__file__).resolve().parents[3] / "helm" / "setu" / "files"


class Hook(BaseHTTPRequestHandler):
    """A webhook that refuses (400) a body saying "fail", is unavailable (503) to one saying
    "retry", answers one saying "hang" only when the test ends (``released``), and takes
    everything else."""

    released = threading.Event()

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length") or 0))
        if body == b"hang":
            self.released.wait(150)
        self.send_response({b"fail": 400, b"retry": 503}.get(body, 200))
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def hook() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    Hook.released.clear()
    yield f"http://127.0.0.1:{server.server_address[1]}/hook"
    Hook.released.set()
    server.shutdown()
    server.server_close()


def rules_without_waiting(path: Path) -> Path:
    """The chart's rules with each ``for`` left out: Prometheus would hold a parked group's
    alert pending for 15 minutes first (``promtool test rules`` proves the waits)."""
    document = yaml.safe_load((FILES / "alerts.yaml").read_text())
    for group in document["groups"]:
        for rule in group["rules"]:
            rule.pop("for", None)
    path.write_text(yaml.safe_dump(document))
    return path


def prometheus(work: Path, targets: dict[str, str], port: int) -> subprocess.Popen[bytes]:
    """Prometheus scraping each ``targets`` (component -> host:port) every second, labelled as
    the chart's PodMonitor labels them, and evaluating the rules every second."""
    binary = shutil.which("prometheus")
    assert binary is not None, "prometheus is missing: scripts/install installs Debian's"
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(rules_without_waiting(work / "rules.yaml"))],
        "scrape_configs": [
            {
                "job_name": "setu",
                "static_configs": [
                    {"targets": [target], "labels": {"setu_component": component}}
                    for component, target in targets.items()
                ],
            }
        ],
    }
    (work / "prometheus.yml").write_text(yaml.safe_dump(config))
    log = (work / "prometheus.log").open("wb")
    return subprocess.Popen(
        [
            binary,
            f"--config.file={work / 'prometheus.yml'}",
            f"--storage.tsdb.path={work / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )


def ready(url: str) -> bool:
    try:
        return httpx.get(url, timeout=5).is_success
    except httpx.HTTPError:
        return False


def firing(prom: str, alert: str, **labels: str) -> bool:
    alerts = httpx.get(f"{prom}/api/v1/alerts", timeout=5).json()["data"]["alerts"]
    return any(
        a["labels"]["alertname"] == alert
        and a["state"] == "firing"
        and labels.items() <= a["labels"].items()
        for a in alerts
    )


def query(prom: str, expr: str) -> list[Any]:
    answer = httpx.get(f"{prom}/api/v1/query", params={"query": expr}, timeout=10).json()
    assert answer["status"] == "success", (expr, answer)
    result: list[Any] = answer["data"]["result"]
    return result


def dashboard_queries() -> list[tuple[str, str]]:
    dashboard = json.loads((FILES / "dashboard.json").read_text())
    return [
        (panel["title"], target["expr"].replace("$__rate_interval", "1m"))
        for panel in dashboard["panels"]
        for target in panel.get("targets", ())
    ]


def test_prometheus_fires_the_parked_alert_and_every_dashboard_query_has_data(
    dev_stack: DevStack, tmp_path: Path, hook: str
) -> None:
    # (the stack's real-time batches last 30 s: conftest.py)
    metrics, key, api_url = dev_stack.metrics, dev_stack.key, dev_stack.api
    targets = {"api": f"127.0.0.1:{dev_stack.ports['api']}"}
    for component, name in (("ingest", "ingest"), ("delivery", "worker")):
        found = next(part for part in metrics.split(", ") if part.startswith(name + " "))
        targets[component] = found.split("//", 1)[1].removesuffix("/metrics")
    prom_port = any_free_port()
    server = prometheus(tmp_path, targets, prom_port)
    prom = f"http://127.0.0.1:{prom_port}"
    try:
        wait_for("Prometheus ready", lambda: ready(f"{prom}/-/ready"), 60)
        api = httpx.Client(base_url=api_url, headers={"Authorization": f"Bearer {key}"}, timeout=30)
        # Given a subscription whose endpoint refuses one group's head
        assert api.post("/v1/projects", json={"name": "obs"}).status_code == 201
        topic = {"name": "t", "grouped": True, "partitions": 2}
        assert api.post("/v1/projects/obs/topics", json=topic).status_code == 201
        # (calls may take up to 2 minutes: one stays unanswered, below)
        sub = {"name": "s", "topic": "t", "endpoint": {"url": hook, "timeout_ms": 120_000}}
        assert api.post("/v1/projects/obs/subscriptions", json=sub).status_code == 201
        produce = "/v1/projects/obs/topics/t/produce"

        def send(message_id: str, group: str, body: bytes) -> None:
            headers = {"X_MESSAGE_ID": message_id, "X_GROUP_ID": group}
            assert api.post(produce, headers=headers, content=body).status_code == 200

        # When one group's head fails for good (400), another's keeps being retried (503),
        # a third's call goes unanswered (a message held), and traffic flows for the rates
        send("w-1", "W", b"hang")
        send("g-1", "G", b"fail")
        send("g-2", "G", b"waits behind g-1")
        send("r-1", "R", b"retry")
        for n in range(40):
            send(f"m-{n}", f"h-{n % 7}", b"ok")
            time.sleep(0.25)
        # Then Prometheus fires the parked-groups alert for that subscription
        wait_for(
            "SetuGroupsParked firing",
            lambda: firing(prom, "SetuGroupsParked", project="obs", subscription="s"),
            120,
        )
        # And every query of the dashboard returns data
        empty = [
            f"{title}: {expr}" for title, expr in dashboard_queries() if not has_data(prom, expr)
        ]
        assert not empty, "dashboard queries without data:\n" + "\n".join(empty)
        # And no component is down
        assert not firing(prom, "SetuComponentDown")
    finally:
        Hook.released.set()  # the unanswered call ends, so the worker stops at once
        server.terminate()
        server.wait(30)


def has_data(prom: str, expr: str, timeout_s: float = 30) -> bool:
    """Whether ``expr`` returns a series within ``timeout_s`` (rates need two scrapes)."""
    deadline = time.monotonic() + timeout_s
    while not query(prom, expr):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)
    return True
