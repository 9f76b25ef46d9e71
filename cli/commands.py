"""The process sub-commands: each builds what its process needs from Settings and runs it.

The modules they run are imported only when the command runs, so ``setu --help`` works in a
partial install and a missing module is reported as such (exit code 3), not as a traceback.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from setu.settings import Settings


class NotInstalled(Exception):
    """Raised when the module (or the function in it) that a command runs does not exist."""


@contextmanager
def installed(module: str) -> Iterator[None]:
    """Around the import of ``module``: its absence (or its package's) in a partial install
    raises NotInstalled; a module missing *inside* ``module``'s own imports is a real error
    and is re-raised."""
    try:
        yield
    except ModuleNotFoundError as error:
        missing = error.name or ""
        if module == missing or module.startswith(missing + "."):
            raise NotInstalled(f"{module} is not present in this installation") from error
        raise


def local_address(host: str) -> str:
    """The address to reach a server that listens on ``host`` from the same machine."""
    if host in ("0.0.0.0", ""):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


def run_api(settings: Settings) -> int:
    """Serves the HTTP API with uvicorn until SIGINT/SIGTERM."""
    import uvicorn

    with installed("api.app"):
        from api.app import create_app
        from api.server import uvicorn_options
    app = create_app(settings)
    uvicorn.run(
        app,
        **uvicorn_options(settings.http_head_timeout_ms),
        host=settings.api_host,
        port=settings.api_port,
        log_level=settings.log_level.lower(),
        access_log=settings.api_access_log,
        timeout_graceful_shutdown=10,
    )
    return 0


def check_api(settings: Settings) -> int:
    """0 when this machine's API answers ``/v1/health`` with a 2xx, else 1."""
    from cli.probes import http_ok

    url = f"http://{local_address(settings.api_host)}:{settings.api_port}/v1/health"
    return 0 if http_ok(url) else 1


def run_deliver(settings: Settings) -> int:
    with installed("delivery.worker"):
        from delivery.worker import run
    run(settings)
    return 0


def run_ingest(settings: Settings) -> int:
    """Runs the Spark job, with the Kafka connector jars from the cache unless SETU_SPARK_JARS,
    and with the de-duplication operator's jar (built on first use) either way."""
    with installed("spark.job"):
        from spark.job import run
    jars: list[str] = settings.spark_jars.split(",") if settings.spark_jars else []
    if not jars:
        from cli.jars import resolve_spark_jars

        jars = [str(jar) for jar in resolve_spark_jars(settings)]
    from cli.jvm import ingest_jar

    jars.append(str(ingest_jar(settings)))
    run(settings.model_copy(update={"spark_jars": ",".join(jars)}))
    return 0


def run_redrive(settings: Settings, project: str, topic: str, say: Callable[[str], None]) -> int:
    """Copies a topic's set-aside ingest records to its main log (spark.redrive)."""
    if not settings.kafka_bootstrap:
        say("setu redrive: SETU_KAFKA_BOOTSTRAP is not set")
        return 2
    with installed("spark.redrive"):
        from spark.redrive import redrive
    done = redrive(
        settings.kafka_bootstrap, project, topic, client_config=settings.kafka_client_config()
    )
    say(f"setu redrive: copied {done.copied} record(s) from {done.source} to {done.target}")
    return 0


def run_migrate(settings: Settings) -> int:
    with installed("state.migrate"):
        from state.migrate import upgrade
    from state.sealing import required_sealer

    # The key is needed only when there are stored secrets to seal (revision 0003 says so).
    sealer = required_sealer(settings.secret_key) if settings.secret_key else None
    upgrade(settings.resolved_database_url(), sealer=sealer)
    return 0


def run_secrets(settings: Settings, action: str, say: Callable[[str], None]) -> int:
    """``setu secrets new-key`` and ``setu secrets rotate`` (docs/security.md §5)."""
    from state.sealing import Sealer, required_sealer

    if action == "new-key":
        say(Sealer.new_key())
        return 0
    with installed("state.metadata"):
        from state.metadata import MetadataStore
    store = MetadataStore(settings.resolved_database_url(), required_sealer(settings.secret_key))
    try:
        count = store.reseal_secrets()
    finally:
        store.close()
    say(
        f"setu secrets rotate: sealed the secrets of {count} subscription(s) and notification "
        "endpoint(s) with the first key"
    )
    return 0


def check_migrate(settings: Settings) -> int:
    """0 when the database is at the newest revision this code knows, else 1."""
    with installed("state.migrate"):
        from state.migrate import current, head
    at, want = current(settings.resolved_database_url()), head()
    if at != want:
        print(f"database at revision {at or 'none'}, code needs {want}", file=sys.stderr)
        return 1
    return 0


def fetch_jars(settings: Settings, *, kafka: bool = True) -> int:
    """Downloads the Spark connector's jars, and unless ``kafka`` is False the broker's, into
    the cache dir, and builds the ingest job's de-duplication operator (cli/jvm.py)."""
    from cli.jars import resolve_kafka_jars, resolve_spark_jars

    if kafka:
        broker = resolve_kafka_jars(settings)
        print(f"Kafka {settings.kafka_version}: {len(broker)} jars in {broker[0].parent}")
    from cli.jvm import ingest_jar, pyspark_version

    spark = resolve_spark_jars(settings)
    connector = settings.spark_connector_version
    print(f"Spark {pyspark_version()}, its Kafka connector {connector}: ", end="")
    print(", ".join(p.name for p in spark))
    print(f"ingest operator: {ingest_jar(settings)}")
    return 0


def check_deliver(settings: Settings) -> int:
    """0 while this machine's delivery worker keeps its Redis heartbeat key alive, else 1."""
    with installed("delivery.worker"):
        from delivery.worker import check
    problem = check(settings)
    if problem is not None:
        print(problem, file=sys.stderr)
        return 1
    return 0
