"""The Helm chart's rendered manifests run as pods from the image built here, configured only
by the chart's ConfigMap and Secret, against real Kafka, Redis and PostgreSQL (tests/install/
kube.py says how each object is played). What a user installing the chart relies on: the
migration Job succeeds and can run again, every pod runs as the chart's user on a read-only
root filesystem and answers its probes on the ports the chart declares, the README quickstart
goes end to end through an API pod to a webhook, and replacing the API and worker pods one at
a time under load, as a Deployment update does, loses and reorders nothing."""

from __future__ import annotations

import json
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from setu.client import HttpClient
from setu.client.errors import SetuClientError
from state.sealing import Sealer
from tests.install.kube import Cluster, Manifest, Pod, by_kind, render
from tests.integration.delivery.support import Receiver
from tests.waiting import wait_for

ADMIN_KEY = "install-test-admin-key-" + uuid.uuid4().hex
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
            "SETU_SECRET_KEY": Sealer.new_key(),
        },
        "api": {"replicas": 2},
        "delivery": {"replicas": 2},
    }


def container_of(objects: list[Manifest], deployment: str) -> Manifest:
    (container,) = by_kind(objects, "Deployment")[deployment]["spec"]["template"]["spec"][
        "containers"
    ]
    return dict(container)


def port_of(container: Manifest, port: int | str) -> int:
    """A probe's port: a number, or the name of one of the container's ports."""
    if isinstance(port, int):
        return port
    return int(next(p["containerPort"] for p in container["ports"] if p["name"] == port))


def api_ready(objects: list[Manifest], pod: Pod) -> bool:
    """The API's readiness probe, as the kubelet runs it."""
    probe = container_of(objects, API)["readinessProbe"]["httpGet"]
    port = port_of(container_of(objects, API), probe["port"])
    try:
        answer = httpx.get(f"http://{pod.address()}:{port}{probe['path']}", timeout=3)
    except httpx.HTTPError:
        return False
    return answer.status_code == 200


def worker_ready(objects: list[Manifest], pod: Pod) -> bool:
    """The worker's readiness probe (a command in the container), as the kubelet runs it."""
    command = container_of(objects, DELIVERY)["readinessProbe"]["exec"]["command"]
    return pod.exec(*command).returncode == 0


def serves_metrics(url: str) -> bool:
    try:
        return "setu_" in httpx.get(url, timeout=5).text
    except httpx.HTTPError:
        return False


def api_url(objects: list[Manifest], pod: Pod) -> str:
    return f"http://{pod.address()}:{port_of(container_of(objects, API), 'http')}"


@dataclass
class Installed:
    objects: list[Manifest]
    cluster: Cluster
    apis: list[Pod]
    workers: list[Pod]
    ingest: Pod

    def ready(self, pod: Pod) -> bool:
        if pod.name.startswith(API):
            return api_ready(self.objects, pod)
        return worker_ready(self.objects, pod)

    def admin(self) -> httpx.Client:
        return httpx.Client(
            base_url=api_url(self.objects, self.apis[0]),
            headers={"Authorization": f"Bearer {ADMIN_KEY}"},
            timeout=30,
        )


def wait_ready(installed: Installed, pod: Pod) -> None:
    wait_for(f"{pod.name} ready", lambda: installed.ready(pod), READY_TIMEOUT_S, every_s=1)


@pytest.fixture(scope="module")
def database(postgres_url: str) -> Iterator[str]:
    name = f"setu_install_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(postgres_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    try:
        yield sa.make_url(postgres_url).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


@pytest.fixture(scope="module")
def installed(
    image: str,
    helm: str,
    services_host: str,
    kafka_bootstrap: str,
    redis_url: str,
    database: str,
) -> Iterator[Installed]:
    """``helm install``, played: the pre-install hook (migrations), then the Deployments."""
    objects = render(helm, chart_values(image, kafka_bootstrap, redis_url, database), RELEASE)
    cluster = Cluster(objects)
    try:
        cluster.create_secrets(hooks=True)
        cluster.run_job(MIGRATE, timeout_s=READY_TIMEOUT_S)
        cluster.create_secrets(hooks=False)
        ingest = cluster.replica(INGEST)
        apis = [cluster.replica(API) for _ in range(2)]
        workers = [cluster.replica(DELIVERY) for _ in range(2)]
        installed = Installed(objects, cluster, apis, workers, ingest)
        for pod in [*apis, *workers]:
            wait_ready(installed, pod)
        yield installed
    except BaseException:
        for pod in cluster.pods:
            print(f"--- {pod.name} ({pod.state()})\n{pod.logs()[-6000:]}")
        raise
    finally:
        cluster.down()


def test_the_migration_job_runs_again_on_an_installed_database(installed: Installed) -> None:
    # Given an installed release (its migration Job ran before the pods started)
    # When the Job runs again, as `helm upgrade` runs it before every upgrade
    pod = installed.cluster.run_job(MIGRATE, timeout_s=READY_TIMEOUT_S)
    # Then it succeeds and the API still answers
    assert pod.exit_code() == 0
    assert installed.admin().get("/v1/projects").status_code == 200


def test_every_pod_runs_as_the_chart_says(installed: Installed) -> None:
    for pod in [*installed.apis, *installed.workers, installed.ingest]:
        info = pod.inspect()
        spec = pod.spec["spec"]
        (container,) = spec["containers"]
        # The chart's user, read-only root filesystem, no capabilities, no escalation
        assert info["Config"]["User"].split(":")[0] == str(spec["securityContext"]["runAsUser"])
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        assert info["HostConfig"]["ReadonlyRootfs"] is True
        assert info["HostConfig"]["CapDrop"] and not info["HostConfig"]["CapAdd"]
        assert "no-new-privileges" in " ".join(info["HostConfig"]["SecurityOpt"] or [])
        # Only what the ConfigMap and the Secret hold, plus the container's own env
        env = dict(e.split("=", 1) for e in info["Config"]["Env"])
        assert (
            env["SETU_KAFKA_BOOTSTRAP"]
            == installed.cluster.configmaps(False)[0]["data"]["SETU_KAFKA_BOOTSTRAP"]
        )
        assert env["SETU_ADMIN_KEY"] == ADMIN_KEY
        # And it is still running, nothing written outside its volumes refused it
        assert pod.state() == "running", pod.logs()[-4000:]
    # The workers are named after their pods (the chart's SETU_WORKER_ID = metadata.name)
    for worker in installed.workers:
        env = dict(e.split("=", 1) for e in worker.inspect()["Config"]["Env"])
        assert env["SETU_WORKER_ID"] == worker.name


def test_probes_and_metrics_answer_on_the_ports_the_chart_declares(installed: Installed) -> None:
    objects = installed.objects
    api = container_of(objects, API)
    for pod in installed.apis:
        # readiness (httpGet) and liveness (tcpSocket) as declared
        assert api_ready(objects, pod)
        liveness = port_of(api, api["livenessProbe"]["tcpSocket"]["port"])
        socket.create_connection((pod.address(), liveness), timeout=3).close()
        stream_port = port_of(api, "stream")
        socket.create_connection((pod.address(), stream_port), timeout=3).close()
    for pod in installed.workers:
        assert worker_ready(objects, pod)
    # Prometheus scrapes each pod where its annotations say
    for deployment, pods in ((API, installed.apis), (DELIVERY, installed.workers)):
        annotations = by_kind(objects, "Deployment")[deployment]["spec"]["template"]["metadata"][
            "annotations"
        ]
        for pod in pods:
            url = f"http://{pod.address()}:{annotations['prometheus.io/port']}{annotations['prometheus.io/path']}"
            assert serves_metrics(url)
    ingest = container_of(objects, INGEST)
    url = f"http://{installed.ingest.address()}:{port_of(ingest, 'metrics')}/metrics"
    wait_for("ingest metrics", lambda: serves_metrics(url), READY_TIMEOUT_S, every_s=1)


def test_the_quickstart_goes_through_an_api_pod_to_a_webhook(
    installed: Installed, webhook: Receiver
) -> None:
    # The README's quickstart, against an API pod
    project = f"shop{uuid.uuid4().hex[:6]}"
    with installed.admin() as admin:
        assert admin.post("/v1/projects", json={"name": project}).status_code == 201
        topic = {"name": "orders", "grouped": True, "partitions": 6}
        assert admin.post(f"/v1/projects/{project}/topics", json=topic).status_code == 201
        subscription = {
            "name": "billing",
            "topic": "orders",
            "grouped": True,
            "endpoint": {"url": webhook.url},
        }
        created = admin.post(f"/v1/projects/{project}/subscriptions", json=subscription)
        assert created.status_code == 201, created.text
        key = admin.post(
            f"/v1/projects/{project}/keys",
            json={"name": "checkout", "role": "producer", "topics": ["orders"]},
        )
        assert key.status_code == 201, key.text
        producer_key = key.json()["key"]
        other_pod = api_url(installed.objects, installed.apis[1])
        produced = httpx.post(
            f"{other_pod}/v1/projects/{project}/topics/orders/produce",
            headers={
                "Authorization": f"Bearer {producer_key}",
                "X-Message-Id": "m-1",
                "X-Group-Id": "customer-42",
            },
            json={"total": 10},
            timeout=30,
        )
        assert produced.status_code in (200, 201, 202), produced.text
        wait_for("m-1 delivered", lambda: webhook.delivered() == ["m-1"], 120)
        (call,) = [c for c in webhook.calls if c.message_id == "m-1"]
        assert json.loads(call.body) == {"total": 10}
        assert call.group == "customer-42"
        status = admin.get(f"/v1/projects/{project}/subscriptions/billing/status")
        assert status.status_code == 200


@dataclass
class Load:
    """A producer sending numbered messages for ``groups`` groups through whichever API pod
    answers, as a Service would route it: a pod that goes away costs a retry with the same
    producer and sequence ids on another pod, never a second message."""

    installed: Installed
    project: str
    key: str
    groups: int = 8
    sent: list[tuple[str, str]] = field(default_factory=list)  # (group, message id)
    failures: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
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
            for pod in list(self.installed.apis):
                try:
                    client = HttpClient(
                        api_url(self.installed.objects, pod), self.key, attempts=1, timeout_s=5
                    )
                    client.produce(
                        self.project,
                        "orders",
                        b'{"n": %d}' % sequence,
                        message_id=message_id,
                        group_id=group,
                        producer_id="load",
                        sequence_id=sequence,
                    )
                    return
                except SetuClientError as error:
                    self.failures.append(f"{pod.name}: {error}")
                except Exception as error:  # a pod gone between listing and calling
                    self.failures.append(f"{pod.name}: {error!r}")
            time.sleep(0.2)
        raise AssertionError(f"no API pod took {message_id}: {self.failures[-3:]}")


def roll(installed: Installed, pods: list[Pod], deployment: str) -> None:
    """A Deployment update with maxSurge 1, maxUnavailable 0: a new pod, ready, then an old
    one ended (SIGTERM, its grace period), one at a time."""
    for old in list(pods):
        new = installed.cluster.replica(deployment)
        wait_ready(installed, new)
        pods.append(new)
        pods.remove(old)
        old.stop()
        # It ended on SIGTERM within its grace period, not killed at its end
        assert old.exit_code() == 0, old.logs()[-4000:]


def test_a_rolling_update_of_api_and_worker_pods_under_load_loses_and_reorders_nothing(
    installed: Installed, webhook: Receiver
) -> None:
    project = f"roll{uuid.uuid4().hex[:6]}"
    with installed.admin() as admin:
        assert admin.post("/v1/projects", json={"name": project}).status_code == 201
        topic = {"name": "orders", "grouped": True, "partitions": 6}
        assert admin.post(f"/v1/projects/{project}/topics", json=topic).status_code == 201
        subscription = {
            "name": "billing",
            "topic": "orders",
            "grouped": True,
            "endpoint": {"url": webhook.url},
        }
        assert (
            admin.post(f"/v1/projects/{project}/subscriptions", json=subscription).status_code
            == 201
        )
        key = admin.post(
            f"/v1/projects/{project}/keys",
            json={"name": "load", "role": "producer", "topics": ["orders"]},
        ).json()["key"]
    load = Load(installed, project, key)
    producer = threading.Thread(target=load.run, name="load", daemon=True)
    producer.start()
    # Deliveries flow before the update starts (the sentinel that the system is alive)
    wait_for("first deliveries", lambda: len(webhook.delivered()) >= 20, 120)
    roll(installed, installed.workers, DELIVERY)
    roll(installed, installed.apis, API)
    load.stop.set()
    producer.join(timeout=120)
    assert not producer.is_alive()
    sent = list(load.sent)
    print(f"rolling update: {len(sent)} messages sent, {len(load.failures)} calls retried")
    # Every message arrives, each group in the order it was sent
    wait_for(
        f"all {len(sent)} messages delivered",
        lambda: set(webhook.delivered()) >= {m for _, m in sent},
        300,
    )
    for group in {g for g, _ in sent}:
        expected = [m for g, m in sent if g == group]
        # Pods ended with SIGTERM hand their groups over: not even a repeat
        assert webhook.delivered(group) == expected, group
    assert len(sent) > 100
