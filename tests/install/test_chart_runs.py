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
import uuid
from collections.abc import Iterator

import httpx
import pytest

from tests.install.kube import Cluster, by_kind, render
from tests.install.support import (
    ADMIN_KEY,
    API,
    DELIVERY,
    MIGRATE,
    READY_TIMEOUT_S,
    RELEASE,
    Installed,
    Load,
    api_url,
    assert_delivered_in_order,
    chart_values,
    install,
    port_of,
    quickstart,
    ready,
    roll,
    serves_metrics,
    show_logs,
)
from tests.integration.delivery.support import Receiver
from tests.waiting import wait_for


@pytest.fixture(scope="module")
def installed(
    image: str, helm: str, services_host: str, kafka_bootstrap: str, redis_url: str, database: str
) -> Iterator[Installed]:
    """``helm install`` of this checkout's chart and image, played."""
    objects = render(helm, chart_values(image, kafka_bootstrap, redis_url, database), RELEASE)
    cluster = Cluster(objects)
    try:
        yield install(cluster)
    except BaseException:
        show_logs(cluster)
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
        # The chart's user, read-only root filesystem, no capabilities, no escalation
        assert info["Config"]["User"].split(":")[0] == str(spec["securityContext"]["runAsUser"])
        assert pod.container["securityContext"]["readOnlyRootFilesystem"] is True
        assert info["HostConfig"]["ReadonlyRootfs"] is True
        assert info["HostConfig"]["CapDrop"] and not info["HostConfig"]["CapAdd"]
        assert "no-new-privileges" in " ".join(info["HostConfig"]["SecurityOpt"] or [])
        # Settings from the ConfigMap and the Secret
        env = dict(e.split("=", 1) for e in info["Config"]["Env"])
        (configmap,) = installed.cluster.configmaps(hooks=False)
        assert env["SETU_KAFKA_BOOTSTRAP"] == configmap["data"]["SETU_KAFKA_BOOTSTRAP"]
        assert env["SETU_ADMIN_KEY"] == ADMIN_KEY
        # And it is still running: nothing it writes outside its volumes stopped it
        assert pod.state() == "running", pod.logs()[-4000:]
    # The workers are named after their pods (the chart's SETU_WORKER_ID = metadata.name)
    for worker in installed.workers:
        env = dict(e.split("=", 1) for e in worker.inspect()["Config"]["Env"])
        assert env["SETU_WORKER_ID"] == worker.name


def test_probes_and_metrics_answer_on_the_ports_the_chart_declares(installed: Installed) -> None:
    for pod in installed.apis:
        # readiness (httpGet) and liveness (tcpSocket) as declared, and streaming produce
        assert ready(pod)
        liveness = port_of(pod, pod.container["livenessProbe"]["tcpSocket"]["port"])
        socket.create_connection((pod.address(), liveness), timeout=3).close()
        socket.create_connection((pod.address(), pod.ports["stream"]), timeout=3).close()
    for pod in installed.workers:
        assert ready(pod)
    # Prometheus scrapes each pod where its annotations say
    deployments = by_kind(installed.cluster.objects, "Deployment")
    for deployment, pods in ((API, installed.apis), (DELIVERY, installed.workers)):
        annotations = deployments[deployment]["spec"]["template"]["metadata"]["annotations"]
        port, path = annotations["prometheus.io/port"], annotations["prometheus.io/path"]
        for pod in pods:
            assert serves_metrics(f"http://{pod.address()}:{port}{path}")
    ingest = installed.ingest
    url = f"http://{ingest.address()}:{ingest.ports['metrics']}/metrics"
    wait_for("ingest metrics", lambda: serves_metrics(url), READY_TIMEOUT_S, every_s=1)


def test_the_quickstart_goes_through_an_api_pod_to_a_webhook(
    installed: Installed, webhook: Receiver
) -> None:
    project = f"shop{uuid.uuid4().hex[:6]}"
    producer_key = quickstart(installed, webhook, project, "checkout")
    produced = httpx.post(
        f"{api_url(installed.apis[1])}/v1/projects/{project}/topics/orders/produce",
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
    with installed.admin() as admin:
        status = admin.get(f"/v1/projects/{project}/subscriptions/billing/status")
    assert status.status_code == 200


def test_a_rolling_update_of_api_and_worker_pods_under_load_loses_and_reorders_nothing(
    installed: Installed, webhook: Receiver
) -> None:
    project = f"roll{uuid.uuid4().hex[:6]}"
    load = Load(
        lambda: list(installed.apis), project, quickstart(installed, webhook, project, "load")
    )
    load.start()
    # Deliveries flow before the update starts (the sentinel that the system is alive)
    wait_for("first deliveries", lambda: len(webhook.delivered()) >= 20, 120)
    roll(installed.cluster, installed.workers, DELIVERY)
    roll(installed.cluster, installed.apis, API)
    sent = load.finish()
    print(f"rolling update: {len(sent)} messages sent, {len(load.failures)} calls retried")
    assert len(sent) > 100
    # Pods ended with SIGTERM hand their work over: nothing lost, reordered or repeated
    assert_delivered_in_order(webhook, sent)
