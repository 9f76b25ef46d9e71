"""``setu dev up``: the whole stack on one machine, stopped cleanly by Ctrl-C.

Order: Kafka and Redis (unless given), migrations on the metadata store, then the API, the
ingest job and one delivery worker as `setu` child processes. Everything keeps its data under
the data dir, so a second run carries on where the first stopped.

Kafka is one broker, or with ``--brokers 3`` (``SETU_DEV_KAFKA_BROKERS=3``) a cluster of three
nodes in ``kafka-cluster/`` (cli/kafka_cluster.py) whose topics, Setu's and Kafka's own, get
three replicas and take a write once two of them hold it.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping
from pathlib import Path

import redis

from cli.dev_settings import DevSettings
from cli.ports import PortBook, PortBusy, is_free
from cli.probes import NotReady, StopRequested, http_ok, wait_until
from cli.processes import EXIT_NOT_AVAILABLE, ChildSpec, tail
from cli.services import (
    DEFAULT_PORTS,
    SETUP_ERRORS,
    PortPlan,
    cluster_default_ports,
    start_kafka,
    start_kafka_cluster,
    start_redis,
)
from cli.spark_local import LocalSparkCluster
from cli.stack import Report, Stack, death_reason, stop_on_signals
from setu.clock import now_ms
from setu.redact import url_without_password
from setu.settings import Settings, is_local_master
from state.ingest_status import RedisIngestStatus, ingest_view
from state.sealing import Sealer

DEFAULT_API_PORT = 8080
# Streaming produce (docs/streaming.md), served by the API process.
DEFAULT_STREAM_PORT = 8070
# Where the ingest job and the delivery worker serve /metrics (the chart's ports).
DEFAULT_METRICS_PORTS = {"ingest_metrics": 9465, "delivery_metrics": 9464}
# A local Spark cluster's master (Spark's usual port) and its web UI.
DEFAULT_SPARK_PORTS = {"spark_master": 7077, "spark_ui": 8090}


class MigrationFailed(Exception):
    """Raised when ``setu migrate`` fails against the dev database."""


def stack_env(
    kafka_bootstrap: str,
    redis_url: str,
    database_url: str,
    data_dir: Path,
    cache_dir: Path,
    api_host: str,
    api_port: int,
    ingest_metrics_port: int | None = None,
    delivery_metrics_port: int | None = None,
    stream_port: int | None = None,
) -> dict[str, str]:
    """The SETU_* variables every child of ``dev up`` runs with (webhooks on loopback allowed)."""
    metrics = {
        "SETU_INGEST_METRICS_PORT": ingest_metrics_port,
        "SETU_DELIVERY_METRICS_PORT": delivery_metrics_port,
        "SETU_STREAM_PORT": stream_port,
    }
    return {
        **{name: str(port) for name, port in metrics.items() if port is not None},
        "SETU_KAFKA_BOOTSTRAP": kafka_bootstrap,
        "SETU_REDIS_URL": redis_url,
        "SETU_DATABASE_URL": database_url,
        "SETU_DATA_DIR": str(data_dir),
        "SETU_CACHE_DIR": str(cache_dir),
        "SETU_API_HOST": api_host,
        "SETU_API_PORT": str(api_port),
        "SETU_ALLOW_PRIVATE_ENDPOINTS": "true",
        "PYTHONUNBUFFERED": "1",
    }


def setu_argv(*command: str) -> tuple[str, ...]:
    """argv that runs a `setu` sub-command with this interpreter."""
    return (sys.executable, "-m", "cli.main", *command)


def dev_admin_key(settings: Settings, data_dir: Path) -> str:
    """``SETU_ADMIN_KEY`` when set; else the key kept in the data folder, made on first use
    (readable by its owner only)."""
    if settings.admin_key is not None:
        return settings.admin_key.get_secret_value()
    return kept_secret(data_dir / "admin-key", lambda: "setu_admin_" + secrets.token_urlsafe(32))


def dev_secret_key(settings: Settings, data_dir: Path) -> str:
    """``SETU_SECRET_KEY`` when set; else the sealing key kept in the data folder."""
    if settings.secret_key is not None:
        return settings.secret_key.get_secret_value()
    return kept_secret(data_dir / "secret-key", Sealer.new_key)


def kept_secret(path: Path, make: Callable[[], str]) -> str:
    """The secret kept at ``path``; made with ``make`` on first use, readable by its owner
    only."""
    if path.exists():
        return path.read_text().strip()
    path.parent.mkdir(parents=True, exist_ok=True)
    value = make()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(value + "\n")
    return value


def _loopback(env: Mapping[str, str]) -> str:
    host = env.get("SETU_API_HOST", "127.0.0.1")
    return "127.0.0.1" if host in ("0.0.0.0", "") else host


def summary(
    api_url: str, api_up: bool, env: Mapping[str, str], logs: Path, ingest_up: bool = True
) -> str:
    """The lines printed once the stack is up."""
    api_line = f"{api_url}  (docs {api_url}/docs)" if api_up else f"{api_url}  (not up: see logs)"
    ingest_line = "running" if ingest_up else f"not running yet: see {logs / 'ingest.log'}"
    master = env.get("SETU_SPARK_MASTER")
    if master and not is_local_master(master):
        ingest_line += f" (on the Spark cluster {master})"
    metrics = [f"{api_url}/metrics"] + [
        f"{name} http://127.0.0.1:{env[key]}/metrics"
        for name, key in (
            ("ingest", "SETU_INGEST_METRICS_PORT"),
            ("worker", "SETU_DELIVERY_METRICS_PORT"),
        )
        if key in env
    ]
    return "\n".join(
        [
            "setu dev up: ready",
            f"  API       {api_line}",
            f"  Metrics   {', '.join(metrics)}",
            *(
                [f"  Streaming {_loopback(env)}:{env['SETU_STREAM_PORT']}  (docs/streaming.md)"]
                if "SETU_STREAM_PORT" in env
                else []
            ),
            f"  Ingest    {ingest_line}",
            f"  Kafka     {kafka_line(env)}",
            # A password inside either URL is not printed (docs/security.md §8).
            f"  Redis     {url_without_password(env['SETU_REDIS_URL'])}",
            f"  Database  {url_without_password(env['SETU_DATABASE_URL'])}",
            f"  Logs      {logs}",
            "For `setu` and curl in another shell: the API and the admin key (kept in the data",
            "folder; make narrower keys with POST /v1/keys):",
            f"  export SETU_API_URL={api_url}",
            f"  export SETU_API_KEY={env['SETU_ADMIN_KEY']}",
            "Ctrl-C stops everything.",
        ]
    )


def kafka_line(env: Mapping[str, str]) -> str:
    """Where Kafka is, and how many replicas Setu's topics get when more than one."""
    replicas = env.get("SETU_KAFKA_REPLICATION_FACTOR", "1")
    suffix = f"  (topics with {replicas} replicas)" if replicas != "1" else ""
    return env["SETU_KAFKA_BOOTSTRAP"] + suffix


def replication_env(settings: Settings, replication_factor: int) -> dict[str, str]:
    """``SETU_KAFKA_REPLICATION_FACTOR`` for a cluster's replication, unless it was set."""
    if "kafka_replication_factor" in settings.model_fields_set:
        return {}
    return {"SETU_KAFKA_REPLICATION_FACTOR": str(replication_factor)}


def run_migrations(env: Mapping[str, str], log_path: Path, report: Report) -> None:
    """Runs ``setu migrate`` with the stack's settings. Raises MigrationFailed."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        code = subprocess.run(
            setu_argv("migrate"),
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            check=False,
        ).returncode
    if code == EXIT_NOT_AVAILABLE:
        report(f"migrations skipped: {tail(log_path, 1)}")
    elif code != 0:
        raise MigrationFailed(f"setu migrate failed (see {log_path}):\n{tail(log_path, 12)}")


def dev_up(settings: Settings, dev: DevSettings, report: Report) -> int:
    """Runs the stack until SIGINT/SIGTERM/SIGHUP; returns the process exit code."""
    stop = threading.Event()
    stop_on_signals(stop)
    stack = Stack(stop, report)
    try:
        env, api_url = _start(settings, dev, stack, report)
        api_up, ingest_up = _start_processes(stack, env, api_url, dev.ready_timeout_s, report)
        stack.supervisor.poll()
        logs = settings.data_dir.resolve() / "logs"
        report(summary(api_url, api_up, env, logs, ingest_up))
        stack.supervise()
        return 0
    except StopRequested:
        return 0
    except (*SETUP_ERRORS, MigrationFailed) as error:
        report(f"setu dev up failed: {error}")
        return 1
    finally:
        stack.stop_all()
        report("setu dev up: stopped")


# The variable that asks for each port of the stack.
PORT_VARIABLES = {
    "kafka": "SETU_DEV_KAFKA_PORT",
    "kafka_controller": "SETU_DEV_KAFKA_CONTROLLER_PORT",
    "redis": "SETU_DEV_REDIS_PORT",
    "api": "SETU_API_PORT",
    "stream": "SETU_STREAM_PORT",
    "spark_master": "SETU_DEV_SPARK_MASTER_PORT",
    "spark_ui": "SETU_DEV_SPARK_UI_PORT",
}


def refuse_busy_ports(explicit: Mapping[str, int]) -> None:
    """Raises PortBusy, naming the variables, when a port asked for is taken: before anything
    starts, rather than after Kafka and Redis did."""
    busy = [
        f"{PORT_VARIABLES.get(name, name)}={port}"
        for name, port in sorted(explicit.items())
        if not is_free(port)
    ]
    if busy:
        raise PortBusy(
            f"port(s) already in use: {', '.join(busy)}; free them, or unset the variable(s) "
            "and dev up chooses free ports"
        )


def _start(
    settings: Settings, dev: DevSettings, stack: Stack, report: Report
) -> tuple[dict[str, str], str]:
    data_dir = settings.data_dir.resolve()
    logs = data_dir / "logs"
    book = PortBook(data_dir / "dev" / "ports.json")
    explicit = {
        name: port
        for name, port in {
            "kafka": dev.kafka_port,
            "kafka_controller": dev.kafka_controller_port,
            "redis": dev.redis_port,
            "api": settings.api_port if "api_port" in settings.model_fields_set else None,
            "stream": settings.stream_port,
        }.items()
        if port is not None
    }
    explicit.update(
        (name, port)
        for name, port in (("spark_master", dev.spark_master_port), ("spark_ui", dev.spark_ui_port))
        if port is not None
    )
    refuse_busy_ports(explicit)
    defaults = {
        **DEFAULT_PORTS,
        **cluster_default_ports(dev.kafka_brokers),
        "api": DEFAULT_API_PORT,
        "stream": DEFAULT_STREAM_PORT,
        **DEFAULT_METRICS_PORTS,
        **DEFAULT_SPARK_PORTS,
    }
    ports = PortPlan(explicit, book.load(), defaults, {})
    timeout = dev.ready_timeout_s
    kafka, kafka_overrides = start_dev_kafka(settings, dev, stack, ports, data_dir, report)
    redis_url = settings.redis_url
    if redis_url is None:
        report("starting Redis")
        redis_url = start_redis(stack, data_dir / "redis", logs / "redis.log", ports, timeout)
    spark_master = None
    if dev.spark_workers > 0:
        cluster = LocalSparkCluster(
            data_dir / "spark" / "cluster",
            port=ports.take("spark_master"),
            ui_port=ports.take("spark_ui"),
            workers=dev.spark_workers,
            memory=dev.spark_worker_memory,
        )
        report(f"starting a Spark cluster: a master and {dev.spark_workers} worker(s)")
        start_spark_cluster(stack, cluster, logs, timeout)
        spark_master = cluster.master_url
    api_port = ports.take("api")
    stream_port = ports.take("stream")
    ingest_metrics, delivery_metrics = ports.take("ingest_metrics"), ports.take("delivery_metrics")
    # Ports of what did not run this time (another broker count) stay remembered for next time.
    book.save({**ports.remembered, **ports.chosen})
    overrides = stack_env(
        kafka,
        redis_url,
        settings.resolved_database_url(),
        data_dir,
        settings.cache_dir.resolve(),
        settings.api_host,
        api_port,
        ingest_metrics,
        delivery_metrics,
        stream_port,
    )
    overrides.update(kafka_overrides)
    if spark_master is not None:
        overrides["SETU_SPARK_MASTER"] = spark_master
    overrides["SETU_ADMIN_KEY"] = dev_admin_key(settings, data_dir)
    overrides["SETU_SECRET_KEY"] = dev_secret_key(settings, data_dir)
    env = {**os.environ, **overrides}
    report("running migrations")
    run_migrations(env, logs / "migrate.log", report)
    return env, f"http://{settings.api_host}:{api_port}"


def start_dev_kafka(
    settings: Settings,
    dev: DevSettings,
    stack: Stack,
    ports: PortPlan,
    data_dir: Path,
    report: Report,
) -> tuple[str, dict[str, str]]:
    """Starts the broker, or the cluster of ``dev.kafka_brokers`` nodes, unless
    ``SETU_KAFKA_BOOTSTRAP`` names a Kafka already running. Returns its bootstrap address
    (every broker's) and the variables the stack's processes need for it."""
    if settings.kafka_bootstrap is not None:
        if dev.kafka_brokers > 1:
            report("SETU_KAFKA_BOOTSTRAP is set: using that Kafka, starting no brokers")
        return settings.kafka_bootstrap, {}
    logs = data_dir / "logs"
    if dev.kafka_brokers == 1:
        report("starting Kafka (first run fetches its jars with mvn)")
        home = data_dir / "kafka"
        bootstrap = start_kafka(
            stack, settings, home, logs / "kafka.log", ports, dev.kafka_heap, dev.ready_timeout_s
        )
        return bootstrap, {}
    report(f"starting a Kafka cluster of {dev.kafka_brokers} brokers (first run fetches its jars)")
    cluster = start_kafka_cluster(
        stack,
        settings,
        data_dir / "kafka-cluster",
        logs,
        ports,
        dev.kafka_heap,
        dev.ready_timeout_s,
        dev.kafka_brokers,
    )
    return cluster.bootstrap, replication_env(settings, cluster.replication_factor)


def start_spark_cluster(
    stack: Stack, cluster: LocalSparkCluster, logs: Path, timeout_s: float
) -> None:
    """Starts the master and the workers (supervised like every child); returns once every
    worker has registered with the master."""
    env = dict(os.environ)
    stack.start(cluster.master_spec(logs / "spark-master.log", env))
    for index in range(cluster.workers):
        stack.start(cluster.worker_spec(index, logs / f"spark-worker-{index}.log", env))
    wait_until(
        lambda: cluster.alive_workers() >= cluster.workers, "spark workers", timeout_s, stack.stop
    )


def _start_processes(
    stack: Stack, env: dict[str, str], api_url: str, timeout_s: float, report: Report
) -> tuple[bool, bool]:
    """Starts api, ingest and deliver; whether the API answers its health check, and whether
    the ingest query runs (so that a first message is not left waiting for Spark to start)."""
    logs = Path(env["SETU_DATA_DIR"]) / "logs"

    def spec(name: str) -> ChildSpec:
        return ChildSpec(
            name=name,
            argv=setu_argv(name),
            log_path=logs / f"{name}.log",
            env=env,
            # The ingest job stops its query and Spark's JVM itself; a JVM signalled with it
            # dies under the stopping query (a traceback in the log for a clean stop).
            signal_leader_only=name == "ingest",
        )

    report("starting the API, the ingest job and a delivery worker")
    started_ms = now_ms()
    ingest = stack.start(spec("ingest"))
    stack.start(spec("deliver"))
    try:
        stack.start(spec("api"), lambda: http_ok(f"{api_url}/v1/health"), timeout_s)
    except NotReady:
        # Reported by the supervisor, which also restarts it (or gives up if it cannot run).
        return False, False
    report("waiting for the ingest query to run")
    try:
        wait_until(
            lambda: ingest_running(env["SETU_REDIS_URL"], started_ms),
            "ingest",
            timeout_s,
            stack.stop,
            died=lambda: death_reason(ingest),
        )
    except NotReady:
        return True, False
    return True, True


def ingest_running(redis_url: str, since_ms: int) -> bool:
    """Whether an ingest job started at or after ``since_ms`` reports its query running."""
    client: redis.Redis[bytes] = redis.Redis.from_url(redis_url, socket_timeout=2)
    try:
        view = ingest_view(RedisIngestStatus(client).read(), now_ms())
    except redis.RedisError:
        return False
    finally:
        client.close()
    return bool(view["state"] == "running" and (view.get("since_ms") or 0) >= since_ms)
