"""The Helm chart's rendered objects run as pods with ``podman kube play``.

podman plays Pods, Deployments, ConfigMaps and PersistentVolumeClaims. What it does not play is
done here the way Kubernetes would, from the rendered object itself:

- a Secret becomes a podman secret of the same name holding its data (podman resolves
  ``secretRef`` and ``secretKeyRef`` from such secrets);
- a Job's pod template runs as a Pod, and the Job succeeds when its container exits 0;
- a Deployment's replicas are Pods made from its template, named like a ReplicaSet's, so a
  rolling update can start a new pod, wait for it to be ready, then stop an old one;
- Services are not played: each pod has its own address on podman's bridge network, and the
  tests call the pods there (``Pod.address``), as a Service would. Container ports are not
  published on the host (podman would publish each on the host's same port, where replicas
  collide): the tests read them from the rendered manifest.
"""

from __future__ import annotations

import base64
import copy
import json
import os
import subprocess
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "setu"
CONTAINERS_CONF = ROOT / "scripts" / "containers.conf"

Manifest = dict[str, Any]


class PlayFailed(Exception):
    """podman refused a command, or a pod did not get where it had to."""


def podman(*args: str, stdin: str | None = None, check: bool = True) -> str:
    env = {**os.environ, "CONTAINERS_CONF": os.environ.get("CONTAINERS_CONF", str(CONTAINERS_CONF))}
    done = subprocess.run(
        ["podman", *args], input=stdin, capture_output=True, text=True, env=env, check=False
    )
    if check and done.returncode != 0:
        raise PlayFailed(f"podman {' '.join(args[:3])} failed: {done.stderr.strip()}")
    return done.stdout


def render(
    helm: str, values: Mapping[str, Any], release: str = "setu", chart: Path = CHART
) -> list[Manifest]:
    """``helm template`` of ``chart`` (this checkout's by default) with ``values``: every
    rendered object."""
    with tempfile.NamedTemporaryFile("w", suffix=".json") as file:
        json.dump(values, file)
        file.flush()
        done = subprocess.run(
            [helm, "template", release, str(chart), "-f", file.name],
            capture_output=True,
            text=True,
            check=False,
        )
    if done.returncode != 0:
        raise PlayFailed(f"helm template failed: {done.stderr}")
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def by_kind(objects: Sequence[Manifest], kind: str) -> dict[str, Manifest]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


def is_hook(manifest: Manifest) -> bool:
    return "helm.sh/hook" in manifest["metadata"].get("annotations", {})


@dataclass
class Pod:
    """One played pod: its name, its manifest, and its only container as the chart declares it
    (with the ports, which are not played: see the module's doc)."""

    name: str
    spec: Manifest
    container: Manifest

    @property
    def ports(self) -> dict[str, int]:
        return {p["name"]: int(p["containerPort"]) for p in self.container.get("ports", [])}

    @property
    def container_id(self) -> str:
        # podman names a played pod's container "<pod>-<container>".
        return f"{self.name}-{self.container['name']}"

    def address(self) -> str:
        out = podman("inspect", "--format", "{{json .NetworkSettings.Networks}}", self.container_id)
        networks = json.loads(out)
        (network,) = networks.values()
        return str(network["IPAddress"])

    def inspect(self) -> Manifest:
        (info,) = json.loads(podman("inspect", self.container_id))
        return dict(info)

    def state(self) -> str:
        return podman("inspect", "--format", "{{.State.Status}}", self.container_id).strip()

    def exit_code(self) -> int:
        return int(podman("inspect", "--format", "{{.State.ExitCode}}", self.container_id))

    def exec(self, *command: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "CONTAINERS_CONF": str(CONTAINERS_CONF)}
        return subprocess.run(
            ["podman", "exec", self.container_id, *command],
            capture_output=True,
            text=True,
            env=env,
            check=False,
        )

    def logs(self) -> str:
        env = {**os.environ, "CONTAINERS_CONF": str(CONTAINERS_CONF)}
        done = subprocess.run(
            ["podman", "logs", self.container_id], capture_output=True, text=True, env=env
        )
        return done.stdout + done.stderr

    def stop(self, grace_s: int = 30) -> None:
        """As Kubernetes ends a pod: SIGTERM, then SIGKILL after the grace period, its network
        up until the container has exited. (``podman pod stop`` takes the pod's network down
        while the container is still ending, which Kubernetes never does: the container is
        stopped alone, and the rest of the pod goes with ``down``.)"""
        podman("stop", "--time", str(grace_s), self.container_id)


@dataclass
class Cluster:
    """The pods, secrets and volumes played for one test, all removed by :meth:`down`."""

    objects: list[Manifest]
    pods: list[Pod] = field(default_factory=list)
    secrets: list[str] = field(default_factory=list)
    volumes: list[str] = field(default_factory=list)
    suffix: str = field(default_factory=lambda: uuid.uuid4().hex[:5])

    def upgrade(self, objects: list[Manifest]) -> None:
        """The next release's objects: pods made from now on come from them (``helm upgrade``;
        the pods already running keep theirs until they are replaced)."""
        self.objects = objects

    def configmaps(self, hooks: bool) -> list[Manifest]:
        return [o for o in self.objects if o["kind"] == "ConfigMap" and is_hook(o) == hooks]

    def create_secrets(self, hooks: bool) -> None:
        """Each rendered Secret as a podman secret of the same name, holding its data as
        podman reads it: a JSON object of base64 values."""
        for secret in self.objects:
            if secret["kind"] != "Secret" or is_hook(secret) != hooks:
                continue
            data = dict(secret.get("data") or {})
            for key, value in (secret.get("stringData") or {}).items():
                data[key] = base64.b64encode(str(value).encode()).decode()
            name = secret["metadata"]["name"]
            podman("secret", "rm", name, check=False)
            podman("secret", "create", name, "-", stdin=json.dumps(data))
            self.secrets.append(name)

    def play_pod(self, name: str, template: Manifest, configmaps: Sequence[Manifest]) -> Pod:
        """Runs ``template`` (a pod template: metadata and spec) as the pod ``name``."""
        spec = copy.deepcopy(template["spec"])
        (container,) = spec["containers"]
        declared = copy.deepcopy(container)
        # podman publishes every containerPort on the host's same port, so a second replica
        # (or an old and a new pod during an update) could not start; each pod has its own
        # address on the bridge, where its declared ports answer without being published.
        container.pop("ports", None)
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "labels": template["metadata"].get("labels", {})},
            "spec": spec,
        }
        for claim in spec.get("volumes", []):
            if "persistentVolumeClaim" in claim:
                self.volumes.append(claim["persistentVolumeClaim"]["claimName"])
        played = Pod(name, pod, declared)
        self.pods.append(played)  # removed by down() even when it fails to start
        document = yaml.safe_dump_all([*configmaps, pod])
        podman("kube", "play", "--network", "podman", "-", stdin=document)
        return played

    def run_job(self, name: str, timeout_s: float) -> Pod:
        """The Job ``name``'s pod, run to its end; PlayFailed unless it exited 0."""
        job = by_kind(self.objects, "Job")[name]
        template = copy.deepcopy(job["spec"]["template"])
        pod = self.play_pod(
            f"{name}-{self.suffix}-{len(self.pods)}", template, self.configmaps(True)
        )
        deadline = time.monotonic() + timeout_s
        while pod.state() not in ("exited", "stopped"):
            if time.monotonic() > deadline:
                raise PlayFailed(f"job {name} still running after {timeout_s} s:\n{pod.logs()}")
            time.sleep(0.5)
        if pod.exit_code() != 0:
            raise PlayFailed(f"job {name} exited {pod.exit_code()}:\n{pod.logs()}")
        return pod

    def replica(self, deployment: str) -> Pod:
        """A new pod of ``deployment``, made from its template as its ReplicaSet would."""
        template = by_kind(self.objects, "Deployment")[deployment]["spec"]["template"]
        name = f"{deployment}-{self.suffix}-{len(self.pods)}"
        return self.play_pod(name, template, self.configmaps(False))

    def down(self) -> None:
        for pod in self.pods:
            podman("pod", "rm", "--force", "--time", "5", pod.name, check=False)
        for name in self.secrets:
            podman("secret", "rm", name, check=False)
        for name in self.volumes:
            podman("volume", "rm", "--force", name, check=False)
