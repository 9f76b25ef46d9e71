"""What the install tests share: the values a user sets, a release installed as pods, the
kubelet's probes, a producer routed like a Service, and a Deployment's rolling update."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from setu.client import HttpClient
from setu.client.errors import SetuClientError
from state.sealing import Sealer
from tests.install.kube import Cluster, Pod
from tests.integration.delivery.support import Receiver
from tests.waiting import wait_for

ADMIN_KEY = "install-test-admin-key-" + uuid.uuid4().hex
SEALING_KEY = Sealer.new_key()
RELEASE = "setu"
API, DELIVERY, INGEST, MIGRATE = (
    f"{RELEASE}-{part}" for part in ("api", "delivery", "ingest", "migrate")
)
READY_TIMEOUT_S = 240.0


def chart_values(image: str, kafka: str, redis: str, database: str) -> dict[str, Any]:
    """What a user sets (README, "Installing on Kubernetes"), pointed at this run's services;
    webhooks on this machine's address need private endpoints allowed."""
    repository, tag = image.rsplit(":", 1)
    return {
        "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
        "config": {
            "SETU_KAFKA_BOOTSTRAP": kafka,
            "SETU_KAFKA_REPLICATION_FACTOR": "1",
            "SETU_ALLOW_PRIVATE_ENDPOINTS": "true",
        },
        "secrets": {
            "SETU_DATABASE_URL": database,
            "SETU_REDIS_URL": redis,
            "SETU_ADMIN_KEY": ADMIN_KEY,
            "SETU_SECRET_KEY": SEALING_KEY,
        },
        "api": {"replicas": 2},
        "delivery": {"replicas": 2},
    }


def port_of(pod: Pod, port: int | str) -> int:
    """A probe's port: a number, or the name of one of the pod's declared ports."""
    return port if isinstance(port, int) else pod.ports[port]


def ready(pod: Pod) -> bool:
    """The pod's readiness probe, as the kubelet runs it; a pod without one is ready while
    it runs."""
    probe = pod.container.get("readinessProbe")
    if probe is None:
        return pod.state() == "running"
    if "exec" in probe:
        return pod.exec(*probe["exec"]["command"]).returncode == 0
    get = probe["httpGet"]
    try:
        answer = httpx.get(
            f"http://{pod.address()}:{port_of(pod, get['port'])}{get['path']}", timeout=3
        )
    except httpx.HTTPError:
        return False
    return answer.status_code == 200


def wait_ready(pod: Pod) -> None:
    wait_for(f"{pod.name} ready", lambda: ready(pod), READY_TIMEOUT_S, every_s=1)


def api_url(pod: Pod) -> str:
    return f"http://{pod.address()}:{pod.ports['http']}"


def serves_metrics(url: str) -> bool:
    try:
        return "setu_" in httpx.get(url, timeout=5).text
    except httpx.HTTPError:
        return False


@dataclass(frozen=True)
class Release:
    """An earlier version: its git revision, its chart and its image."""

    revision: str
    chart: Path
    image: str


@dataclass
class Installed:
    """A release's pods: its API and worker replicas and its ingest job."""

    cluster: Cluster
    apis: list[Pod]
    workers: list[Pod]
    ingest: Pod

    def admin(self) -> httpx.Client:
        return httpx.Client(
            base_url=api_url(self.apis[0]),
            headers={"Authorization": f"Bearer {ADMIN_KEY}"},
            timeout=30,
        )


def install(cluster: Cluster) -> Installed:
    """``helm install``, played: the pre-install hook (migrations), then the Deployments, each
    replica ready."""
    cluster.create_secrets(hooks=True)
    cluster.run_job(MIGRATE, timeout_s=READY_TIMEOUT_S)
    cluster.create_secrets(hooks=False)
    ingest = cluster.replica(INGEST)
    apis = [cluster.replica(API) for _ in range(2)]
    workers = [cluster.replica(DELIVERY) for _ in range(2)]
    for pod in [*apis, *workers]:
        wait_ready(pod)
    return Installed(cluster, apis, workers, ingest)


def show_logs(cluster: Cluster) -> None:
    for pod in cluster.pods:
        print(f"--- {pod.name} ({pod.state()})\n{pod.logs()[-6000:]}")


def quickstart(installed: Installed, webhook: Receiver, project: str, key_name: str) -> str:
    """The README quickstart's setup: a project, a grouped topic ``orders``, a subscription
    ``billing`` to ``webhook``, and a producer key (returned)."""
    with installed.admin() as admin:
        answer = admin.post("/v1/projects", json={"name": project})
        assert answer.status_code == 201, answer.text
        topic = {"name": "orders", "grouped": True, "partitions": 6}
        answer = admin.post(f"/v1/projects/{project}/topics", json=topic)
        assert answer.status_code == 201, answer.text
        subscription = {
            "name": "billing",
            "topic": "orders",
            "grouped": True,
            "endpoint": {"url": webhook.url},
        }
        answer = admin.post(f"/v1/projects/{project}/subscriptions", json=subscription)
        assert answer.status_code == 201, answer.text
        key = admin.post(
            f"/v1/projects/{project}/keys",
            json={"name": key_name, "role": "producer", "topics": ["orders"]},
        )
        assert key.status_code == 201, key.text
        return str(key.json()["key"])


@dataclass
class Load:
    """A producer sending numbered messages for ``groups`` groups through the API pods in
    turn, as a Service spreads them: a pod that goes away costs a retry with the same producer
    and sequence ids on another pod, never a second message."""

    apis: Callable[[], list[Pod]]
    project: str
    key: str
    groups: int = 8
    sent: list[tuple[str, str]] = field(default_factory=list)  # (group, message id)
    served: Counter[str] = field(default_factory=Counter)  # messages each pod took
    failures: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None

    def start(self) -> None:
        self.thread = threading.Thread(target=self._run, name="load", daemon=True)
        self.thread.start()

    def finish(self) -> list[tuple[str, str]]:
        self.stop.set()
        assert self.thread is not None
        self.thread.join(timeout=120)
        assert not self.thread.is_alive()
        return list(self.sent)

    def _run(self) -> None:
        sequence = 0
        while not self.stop.is_set():
            sequence += 1
            group = f"g{sequence % self.groups}"
            message_id = f"load:{sequence}"
            self._send(sequence, group, message_id)
            self.sent.append((group, message_id))
            time.sleep(0.02)

    def _send(self, sequence: int, group: str, message_id: str) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            pods = self.apis()
            turn = sequence % len(pods)
            for pod in pods[turn:] + pods[:turn]:
                try:
                    client = HttpClient(api_url(pod), self.key, attempts=1, timeout_s=5)
                    client.produce(
                        self.project,
                        "orders",
                        b'{"n": %d}' % sequence,
                        message_id=message_id,
                        group_id=group,
                        producer_id="load",
                        sequence_id=sequence,
                    )
                    self.served[pod.name] += 1
                    return
                except SetuClientError as error:
                    self.failures.append(f"{pod.name}: {error}")
                except Exception as error:  # a pod gone between listing and calling
                    self.failures.append(f"{pod.name}: {error!r}")
            time.sleep(0.2)
        raise AssertionError(f"no API pod took {message_id}: {self.failures[-3:]}")


def roll(
    cluster: Cluster,
    pods: list[Pod],
    deployment: str,
    while_both: Callable[[Pod, Pod], None] = lambda old, new: None,
) -> None:
    """A Deployment update with maxSurge 1, maxUnavailable 0: a new pod, ready (then
    ``while_both(old, new)`` runs while both serve), then an old one ended (SIGTERM, its grace
    period), one at a time."""
    for old in list(pods):
        new = cluster.replica(deployment)
        wait_ready(new)
        pods.append(new)
        while_both(old, new)
        pods.remove(old)
        old.stop()
        # It ended on SIGTERM within its grace period, not killed at its end
        assert old.exit_code() == 0, old.logs()[-4000:]


def assert_delivered_in_order(webhook: Receiver, sent: list[tuple[str, str]]) -> None:
    """Every message sent arrives, each group's in the order sent, none twice."""
    wait_for(
        f"all {len(sent)} messages delivered",
        lambda: set(webhook.delivered()) >= {m for _, m in sent},
        300,
    )
    for group in {g for g, _ in sent}:
        expected = [m for g, m in sent if g == group]
        assert webhook.delivered(group) == expected, group
