"""``setu``: one command, a sub-command per process, plus the local stack.

    setu api [--check]        the HTTP API (uvicorn)
    setu deliver [--check]    one delivery worker
    setu ingest               the Spark ingest job
    setu migrate [--check]    migrate the metadata store to the newest schema
    setu redrive P T          copy topic T's set-aside ingest records to its main log
    setu dev up [--brokers 1|3] [--spark-workers N]
                              Kafka, Redis, SQLite, ingest, API and a worker on this machine
    setu fetch [--spark-only] download the Kafka and Spark connector jars into the cache and
                              build the ingest job's de-duplication operator
    setu services run -- CMD  run CMD with throwaway Kafka/Redis/PostgreSQL (SETU_TEST_*)
    setu services up          the same services, until Ctrl-C

Settings come from ``SETU_*`` variables (see ``setu.settings``) and are built here, once.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from cli import admin, commands
from cli.commands import NotInstalled
from cli.dev_settings import KAFKA_BROKER_COUNTS, DevSettings
from cli.jvm import BuildFailed
from cli.maven import FetchFailed
from cli.ports import LOOPBACK
from cli.processes import EXIT_NOT_AVAILABLE
from setu.settings import Settings


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="setu",
        description="Kafka-backed ordered webhook delivery. Settings come from SETU_* variables.",
    )
    admin.add_global_options(parser)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    api = sub.add_parser("api", help="serve the HTTP API")
    api.add_argument("--check", action="store_true", help="exit 0 if the API here is healthy")
    deliver = sub.add_parser("deliver", help="run a delivery worker")
    deliver.add_argument("--check", action="store_true", help="exit 0 if the worker is alive")
    sub.add_parser("ingest", help="run the Spark ingest job")
    redrive = sub.add_parser(
        "redrive", help="copy the records the ingest job set aside for a topic to its main log"
    )
    redrive.add_argument("project")
    redrive.add_argument("topic")
    migrate = sub.add_parser("migrate", help="migrate the metadata store to the newest schema")
    migrate.add_argument("--check", action="store_true", help="exit 0 if already migrated")
    keys = sub.add_parser("secrets", help="the key that seals stored secrets (SETU_SECRET_KEY)")
    keys_sub = keys.add_subparsers(dest="secrets_command", required=True, metavar="ACTION")
    keys_sub.add_parser("new-key", help="print a fresh key for SETU_SECRET_KEY")
    keys_sub.add_parser(
        "rotate", help="seal every stored secret again under the first key of SETU_SECRET_KEY"
    )
    admin.add_commands(sub)
    fetch = sub.add_parser("fetch", help="download the Kafka broker and Spark connector jars")
    fetch.add_argument(
        "--spark-only", action="store_true", help="only the Spark connector (for images)"
    )

    dev = sub.add_parser("dev", help="the whole stack on this machine")
    dev_sub = dev.add_subparsers(dest="dev_command", required=True, metavar="ACTION")
    up = dev_sub.add_parser("up", help="run everything until Ctrl-C (data under SETU_DATA_DIR)")
    up.add_argument(
        "--brokers",
        type=int,
        choices=KAFKA_BROKER_COUNTS,
        help="run Kafka as one broker or a cluster of three, topics with three replicas "
        "(SETU_DEV_KAFKA_BROKERS)",
    )
    up.add_argument(
        "--spark-workers",
        type=_workers,
        metavar="N",
        help="run ingest on a local Spark standalone cluster of N workers (SETU_DEV_SPARK_WORKERS)",
    )

    services = sub.add_parser("services", help="throwaway Kafka, Redis, PostgreSQL for tests")
    services_sub = services.add_subparsers(dest="services_command", required=True, metavar="ACTION")
    for name, text in (("run", "run a command with them"), ("up", "run them until Ctrl-C")):
        action = services_sub.add_parser(name, help=text)
        action.add_argument("--env-file", type=Path, help="also write SETU_TEST_* lines here")
        action.add_argument(
            "--host",
            default=LOOPBACK,
            help="the address they listen on (default %(default)s); another one, such as this "
            "machine's own, lets containers reach them (tests/install)",
        )
        if name == "run":
            action.add_argument("argv", nargs=argparse.REMAINDER, help="-- command and args")
    return parser


def _workers(text: str) -> int:
    count = int(text)
    if count < 0:
        raise argparse.ArgumentTypeError("must be 0 or more")
    return count


def say(line: str) -> None:
    print(line, flush=True)


def dev_settings(args: argparse.Namespace) -> DevSettings:
    """``SETU_DEV_*``, with ``--brokers`` and ``--spark-workers`` winning over their
    variables."""
    dev = DevSettings()
    options = {"kafka_brokers": args.brokers, "spark_workers": args.spark_workers}
    given = {name: value for name, value in options.items() if value is not None}
    return dev.model_copy(update=given) if given else dev


def traced(service: str, run: Callable[[], int]) -> int:
    """Runs a Setu process with its tracing set up from the ``OTEL_*`` variables
    (setu/tracing.py), sending what is still batched when it stops."""
    from setu import tracing

    configured = tracing.configure(service)
    try:
        return run()
    finally:
        configured.shutdown()


def run_process(command: str, args: argparse.Namespace, settings: Settings) -> int:
    """``setu api|deliver|ingest``: the process, or with ``--check`` its health probe."""
    if command == "api":
        if args.check:
            return commands.check_api(settings)
        return traced("setu-api", lambda: commands.run_api(settings))
    if command == "deliver":
        if args.check:
            return commands.check_deliver(settings)
        return traced("setu-deliver", lambda: commands.run_deliver(settings))
    return traced("setu-ingest", lambda: commands.run_ingest(settings))


def dispatch(args: argparse.Namespace, settings: Settings) -> int:
    command: str = args.command
    if command in ("api", "deliver", "ingest"):
        return run_process(command, args, settings)
    if command == "redrive":
        return commands.run_redrive(settings, args.project, args.topic, say)
    if command == "migrate":
        return commands.check_migrate(settings) if args.check else commands.run_migrate(settings)
    if command in admin.COMMANDS:
        return admin.run(args)
    if command == "secrets":
        return commands.run_secrets(settings, args.secrets_command, say)
    if command == "fetch":
        return commands.fetch_jars(settings, kafka=not args.spark_only)
    if command == "dev":
        from cli.dev import dev_up

        return dev_up(settings, dev_settings(args), say)
    if command == "services":
        return services(args, settings)
    raise AssertionError(f"unhandled command {command}")


def services(args: argparse.Namespace, settings: Settings) -> int:
    from cli.testbed import testbed

    argv = list(getattr(args, "argv", []))
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if args.services_command == "run" and not argv:
        say("setu services run: give a command after --")
        return 2
    return testbed(settings, DevSettings(), argv, args.env_file, say, args.host)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    settings = Settings()
    try:
        return dispatch(args, settings)
    except NotInstalled as error:
        print(f"setu {args.command}: {error}", file=sys.stderr)
        return EXIT_NOT_AVAILABLE
    except (FetchFailed, BuildFailed) as error:
        print(f"setu {args.command}: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
