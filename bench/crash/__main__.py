"""``python -m bench.crash --duration 30m --out report.json``: the long form of the crash test.

By default the run starts its own Kafka broker and Redis (AOF on) on free ports and kills them
too; ``--shared`` uses the services named by ``SETU_TEST_*`` instead and leaves them alone.
Exits 0 when every check passes, 1 on any violation.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import signal
import sys
import tempfile
import time
from pathlib import Path

from bench.crash.report import summary_lines, write_report
from bench.crash.run import RunConfig, run_crash_test

UNITS = {"": 1, "s": 1, "m": 60, "h": 3600}


def parse_duration(text: str) -> float:
    """Seconds in ``90``, ``90s``, ``30m``, ``1.5h``; raises ValueError otherwise."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", text)
    if not match:
        raise ValueError(f"not a duration: {text!r} (try 90s, 30m or 1h)")
    return float(match.group(1)) * UNITS[match.group(2)]


def parse_range(text: str) -> tuple[float, float]:
    """``3,8`` → (3.0, 8.0); a single number is both ends."""
    parts = [float(p) for p in text.split(",")]
    if len(parts) == 1:
        parts *= 2
    if len(parts) != 2 or not 0 <= parts[0] <= parts[1]:
        raise ValueError(f"not a range: {text!r} (try 3,8)")
    return parts[0], parts[1]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.crash", description=__doc__)
    parser.add_argument("--duration", type=parse_duration, default=parse_duration("30m"))
    parser.add_argument("--out", type=Path, default=Path("bench/results/crash.json"))
    parser.add_argument("--workdir", type=Path, help="default: a new folder under /tmp")
    parser.add_argument("--groups", type=int, default=1000)
    parser.add_argument("--lanes", type=int, default=20, help="producer ids publishing at once")
    parser.add_argument(
        "--subscriptions",
        type=int,
        default=1,
        help="grouped subscriptions of the one topic, each judged on its own",
    )
    parser.add_argument("--rate", type=float, default=40.0, help="messages per second")
    parser.add_argument(
        "--stream-lanes",
        type=int,
        default=0,
        help="of the lanes, how many stream (docs/streaming.md)",
    )
    parser.add_argument(
        "--stream-drop",
        type=parse_duration,
        default=parse_duration("0s"),
        help="each streaming lane drops its connection about this often (0s: never)",
    )
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--chaos-interval", type=parse_range, default=(4.0, 10.0))
    parser.add_argument("--min-kills", type=int, default=1, help="fewer kill events fail the run")
    parser.add_argument("--shared", action="store_true", help="use SETU_TEST_* Kafka and Redis")
    parser.add_argument("--database-url", help="default: SQLite in the work folder")
    parser.add_argument("--seed", type=int)
    parser.add_argument(
        "--outage",
        type=parse_duration,
        default=parse_duration("30s"),
        help="an endpoint outage this long, 40%% into the run (0s: none)",
    )
    parser.add_argument(
        "--spark-workers",
        type=int,
        default=0,
        help="run ingest on a local Spark cluster of N workers, and kill them too",
    )
    parser.add_argument(
        "--faults",
        default="",
        help="faults besides kills, comma-separated: redis-flush, redis-rollback, "
        "redis-failover (runs Redis with a replica and Sentinel), "
        "broker-wipe (with --kafka-nodes 3) (bench/crash/faults.py)",
    )
    parser.add_argument(
        "--kafka-nodes",
        type=int,
        choices=(1, 3),
        default=1,
        help="the run's own Kafka: one broker, or a three-node cluster (replication factor 3)",
    )
    parser.add_argument(
        "--kill-receiver", action="store_true", help="kill the webhook receiver too"
    )
    parser.add_argument(
        "--ingest-mode",
        choices=("micro-batch", "real-time"),
        help="how the ingest job runs (SETU_INGEST_MODE, docs/ingest.md); default: Setu's",
    )
    parser.add_argument(
        "--ingest-log",
        choices=("per-topic", "shared"),
        help="where produced records wait for ingest (SETU_INGEST_LOG; shared: the run's own "
        "shared ingest log, decision 0010); default: Setu's",
    )
    parser.add_argument(
        "--delivery-readers",
        choices=("per-subscription", "shared"),
        help="how workers read (SETU_DELIVERY_READERS, decision 0011); default: Setu's",
    )
    return parser


def exit_on_sigterm() -> None:
    """SIGTERM (a ``kill``, a CI timeout) ends the run as Ctrl-C does: through its ``finally``
    blocks, which stop every component. By default it would end the process at once and leave
    the run's brokers and Setu's processes running, each in a session of its own."""
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    exit_on_sigterm()
    workdir = args.workdir or Path(
        tempfile.mkdtemp(prefix=f"setu-crash-{time.strftime('%H%M%S')}-")
    )
    shared = os.environ if args.shared else {}
    config = RunConfig(
        workdir=workdir,
        duration_s=args.duration,
        groups=args.groups,
        subscriptions=args.subscriptions,
        lanes=args.lanes,
        stream_lanes=args.stream_lanes,
        stream_drop_s=args.stream_drop,
        rate_per_second=args.rate,
        partitions=args.partitions,
        workers=args.workers,
        chaos_interval_s=args.chaos_interval,
        own_brokers=not args.shared,
        kafka_bootstrap=shared.get("SETU_TEST_KAFKA_BOOTSTRAP"),
        redis_url=shared.get("SETU_TEST_REDIS_URL"),
        database_url=args.database_url,
        min_kill_events=args.min_kills,
        drain_timeout_s=600.0,
        spark_workers=args.spark_workers,
        outage_s=args.outage,
        faults=tuple(f for f in args.faults.split(",") if f),
        kill_receiver=args.kill_receiver,
        kafka_nodes=args.kafka_nodes,
        extra_env={
            **({"SETU_INGEST_MODE": args.ingest_mode} if args.ingest_mode else {}),
            **({"SETU_INGEST_LOG": args.ingest_log} if args.ingest_log else {}),
            **({"SETU_DELIVERY_READERS": args.delivery_readers} if args.delivery_readers else {}),
        },
    )
    if args.seed is not None:
        config = dataclasses.replace(config, seed=args.seed)
    report = run_crash_test(config, say=lambda line: print(line, flush=True))
    write_report(report, args.out)
    print("\n".join(summary_lines(report)))
    print(f"report: {args.out}")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
