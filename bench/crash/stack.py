"""The processes of one crash-test run, as :class:`ComponentSpec` s.

Setu's own processes run as ``setu api|ingest|deliver`` with ``SETU_*`` variables, exactly as
deployed; the witnesses run as ``python -m bench.crash.receiver|producer``. In the long form the
run also has its own Kafka broker and Redis (AOF on), started through the same ``cli`` modules
``setu dev up`` uses, on free ports so they never touch the shared services.
"""

from __future__ import annotations

import os
import secrets
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from bench.crash.chaos import ComponentSpec
from cli.processes import ChildSpec
from cli.spark_local import LocalSparkCluster
from setu.names import INGEST_QUERY_CHECKPOINT
from state.sealing import Sealer

REPO_ROOT = Path(__file__).resolve().parents[2]
# Up this long before a component may be killed again: Spark needs a while to start, and a
# killed broker takes everything down with it for its restart (~20 s), so it dies less often.
MIN_UPTIME_S = {"api": 2.0, "ingest": 25.0, "deliver": 3.0, "producer": 2.0, "spark": 30.0}
# Each executor of the cluster mode: one core, a small heap (the state is small).
# One executor per worker, with all its slots (LocalSparkCluster.cores).
SPARK_EXECUTOR_CONF = {"spark.executor.memory": "512m"}
BROKER_MIN_UPTIME_S = {"kafka": 120.0, "redis": 45.0}


@dataclass(frozen=True, slots=True)
class StackLayout:
    """Where everything of one run lives and listens."""

    workdir: Path
    api_port: int
    receiver_port: int
    kafka_bootstrap: str
    redis_url: str
    database_url: str
    workers: int = 2
    extra_env: dict[str, str] = field(default_factory=dict)
    # The API's streaming produce listener (docs/streaming.md); 0: none.
    stream_port: int = 0
    # The run's bootstrap admin key: the API accepts it, the checker and producer send it.
    admin_key: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    secret_key: str = field(default_factory=Sealer.new_key)

    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.admin_key}"}

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    @property
    def receiver_url(self) -> str:
        return f"http://127.0.0.1:{self.receiver_port}"

    @property
    def logs(self) -> Path:
        return self.workdir / "logs"

    @property
    def data_dir(self) -> Path:
        return self.workdir / "data"


def setu_executable() -> str:
    """The ``setu`` command of this Python environment."""
    beside = Path(sys.executable).with_name("setu")
    if beside.exists():
        return str(beside)
    found = shutil.which("setu")
    if found is None:
        raise FileNotFoundError("the setu command is not installed: pip install -e .")
    return found


# The checkout this harness runs from: its children (and Spark's Python workers, which they
# start) import Setu from here first, whatever else an environment has installed. A long run
# once had its Spark workers import an editable install of another checkout.
_CHECKOUT = Path(__file__).resolve().parents[2]


def base_env() -> dict[str, str]:
    """This process's environment without any ``SETU_*`` variable, so nothing leaks in, and
    with this checkout first on ``PYTHONPATH``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SETU_")}
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_CHECKOUT), env.get("PYTHONPATH")) if p)
    return env


def setu_env(layout: StackLayout) -> dict[str, str]:
    return {
        **base_env(),
        "SETU_DATA_DIR": str(layout.data_dir),
        "SETU_KAFKA_BOOTSTRAP": layout.kafka_bootstrap,
        "SETU_REDIS_URL": layout.redis_url,
        "SETU_DATABASE_URL": layout.database_url,
        "SETU_API_HOST": "127.0.0.1",
        "SETU_API_PORT": str(layout.api_port),
        "SETU_ALLOW_PRIVATE_ENDPOINTS": "true",
        **({"SETU_STREAM_PORT": str(layout.stream_port)} if layout.stream_port else {}),
        "SETU_ADMIN_KEY": layout.admin_key,
        "SETU_SECRET_KEY": layout.secret_key,
        **layout.extra_env,
    }


def migrate_argv() -> list[str]:
    return [setu_executable(), "migrate"]


def setu_specs(layout: StackLayout) -> list[ComponentSpec]:
    """API, ingest job and ``layout.workers`` delivery workers, all open to chaos."""
    env = setu_env(layout)
    setu = setu_executable()

    def spec(name: str, command: str, kind: str, **extra: str) -> ComponentSpec:
        return ComponentSpec(
            name=name,
            argv=[setu, command],
            env={**env, **extra},
            cwd=layout.workdir,
            log_path=layout.logs / f"{name}.log",
            min_uptime_s=MIN_UPTIME_S[kind],
        )

    default_checkpoint = str(layout.data_dir / "spark" / "checkpoint")
    checkpoint = env.get("SETU_SPARK_CHECKPOINT_DIR") or default_checkpoint
    # The ingest job is killed again only after its query committed a batch since its restart.
    commits = Path(checkpoint) / INGEST_QUERY_CHECKPOINT / "commits"
    ingest = replace(spec("ingest", "ingest", "ingest"), progress_dir=commits)
    specs = [spec("api", "api", "api"), ingest]
    for n in range(1, layout.workers + 1):
        specs.append(spec(f"deliver-{n}", "deliver", "deliver", SETU_WORKER_ID=f"deliver-{n}"))
    return specs


def receiver_spec(layout: StackLayout, plan: Path, secret: str | None) -> ComponentSpec:
    """The webhook; never killed, so its journal is the ground truth of every call."""
    argv = [
        sys.executable,
        "-m",
        "bench.crash.receiver",
        "--port",
        str(layout.receiver_port),
        "--plan",
        str(plan),
        "--journal",
        str(layout.workdir / "receiver.journal"),
    ]
    if secret is not None:
        argv += ["--secret", secret]
    return ComponentSpec(
        name="receiver",
        argv=argv,
        env=base_env(),
        cwd=REPO_ROOT,
        log_path=layout.logs / "receiver.log",
        chaos=False,
    )


@dataclass(frozen=True, slots=True)
class ProduceShape:
    project: str
    topic: str
    run_id: str
    groups: int
    lanes: int
    messages_per_lane: int
    rate_per_second: float
    large_body_bytes: int = 0
    stream_lanes: int = 0
    stream_drop_s: float = 0.0


def producer_spec(layout: StackLayout, shape: ProduceShape, *, chaos: bool) -> ComponentSpec:
    """The producer; a oneshot (exit 0 = every record acknowledged), killable when ``chaos``."""
    argv = [
        sys.executable,
        "-m",
        "bench.crash.producer",
        "--api",
        layout.api_url,
        "--project",
        shape.project,
        "--topic",
        shape.topic,
        "--run-id",
        shape.run_id,
        "--groups",
        str(shape.groups),
        "--lanes",
        str(shape.lanes),
        "--messages-per-lane",
        str(shape.messages_per_lane),
        "--rate",
        str(shape.rate_per_second),
        "--journal",
        str(producer_journal(layout)),
        "--large-body-bytes",
        str(shape.large_body_bytes),
        "--stream-lanes",
        str(shape.stream_lanes),
        "--stream",
        f"127.0.0.1:{layout.stream_port}",
        "--stream-drop-s",
        str(shape.stream_drop_s),
    ]
    return ComponentSpec(
        name="producer",
        argv=argv,
        env={**base_env(), "SETU_API_KEY": layout.admin_key},
        cwd=REPO_ROOT,
        log_path=layout.logs / "producer.log",
        chaos=chaos,
        min_uptime_s=MIN_UPTIME_S["producer"],
        oneshot=True,
    )


def producer_journal(layout: StackLayout) -> Path:
    return layout.workdir / "producer.journal"


def receiver_journal(layout: StackLayout) -> Path:
    return layout.workdir / "receiver.journal"


def spark_cluster(workdir: Path, workers: int, port: Callable[[], int]) -> LocalSparkCluster:
    return LocalSparkCluster(
        workdir / "spark-cluster", port=port(), ui_port=port(), workers=workers, memory="1g"
    )


def spark_specs(cluster: LocalSparkCluster, workdir: Path) -> list[ComponentSpec]:
    """The master, out of chaos's reach (it only schedules, and a standalone master has no
    state to recover without ZooKeeper), and the workers, killed like any component: a kill
    takes the worker's executor with it."""
    logs = workdir / "logs"
    master = cluster.master_spec(logs / "spark-master.log", base_env())
    specs = [_component(master, workdir, chaos=False)]
    for index in range(cluster.workers):
        worker = cluster.worker_spec(index, logs / f"spark-worker-{index}.log", base_env())
        specs.append(_component(worker, workdir, chaos=True))
    return specs


def _component(child: ChildSpec, workdir: Path, *, chaos: bool) -> ComponentSpec:
    return ComponentSpec(
        name=child.name,
        argv=child.argv,
        env=dict(child.env or {}),
        cwd=workdir,
        log_path=child.log_path,
        chaos=chaos,
        min_uptime_s=MIN_UPTIME_S["spark"],
    )
