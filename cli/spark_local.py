"""A Spark standalone cluster on this machine: one master and N workers, started from the
PySpark distribution's own jars and launch classes (no separate Spark download, no Docker).

``setu dev up --spark-workers N`` runs the ingest job on it, the integration tests kill its
workers under a running job, and the crash test's cluster mode does the same in its chaos loop.
A worker's executors are its children, in its process group: killing the group is a machine
going away.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pyspark

from cli.ports import LOOPBACK
from cli.processes import ChildSpec

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
# The daemons only schedule; executors get their own heap (spark.executor.memory).
DAEMON_HEAP = "256m"


def spark_home() -> Path:
    """The PySpark distribution: its ``jars`` folder holds all of Spark."""
    return Path(pyspark.__file__).parent


def _java(heap: str, main_class: str, *args: str) -> tuple[str, ...]:
    return (
        "java",
        f"-Xmx{heap}",
        "-cp",
        str(spark_home() / "jars" / "*"),
        # No REST submission endpoint: nothing here submits through it.
        "-Dspark.master.rest.enabled=false",
        main_class,
        *args,
    )


def daemon_env(base: dict[str, str]) -> dict[str, str]:
    """What a worker needs to launch executors: Spark's home, and the Scala version, which a
    distribution without build directories cannot find by itself."""
    return {**base, "SPARK_HOME": str(spark_home()), "SPARK_SCALA_VERSION": "2.13"}


@dataclass(frozen=True)
class LocalSparkCluster:
    """Where the master listens, and the workers' size; ``home`` holds their work dirs."""

    home: Path
    port: int
    ui_port: int
    workers: int = 2
    # Task slots each worker offers, not processor cores: in real-time mode every ingest
    # partition and every shuffle partition holds a slot for the whole batch, a task that mostly
    # waits on Kafka (docs/ingest.md, "Slots").
    cores: int = 64
    memory: str = "1g"
    host: str = LOOPBACK

    @property
    def master_url(self) -> str:
        return f"spark://{self.host}:{self.port}"

    def master_spec(self, log_path: Path, env: dict[str, str]) -> ChildSpec:
        argv = _java(
            DAEMON_HEAP,
            MASTER_CLASS,
            *("--host", self.host, "--port", str(self.port)),
            *("--webui-port", str(self.ui_port)),
        )
        return ChildSpec("spark-master", argv, log_path, env=daemon_env(env))

    def worker_spec(self, index: int, log_path: Path, env: dict[str, str]) -> ChildSpec:
        work_dir = self.home / f"worker-{index}"
        argv = _java(
            DAEMON_HEAP,
            WORKER_CLASS,
            *("--host", self.host, "--cores", str(self.cores), "--memory", self.memory),
            *("--work-dir", str(work_dir), "--webui-port", "0"),
            self.master_url,
        )
        return ChildSpec(f"spark-worker-{index}", argv, log_path, env=daemon_env(env))

    def alive_workers(self) -> int:
        """Workers registered with the master and alive (0 while the master is not up)."""
        url = f"http://{self.host}:{self.ui_port}/json/"
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                state = json.loads(response.read())
        except (OSError, urllib.error.URLError, ValueError):
            return 0
        return int(state.get("aliveworkers", 0))
