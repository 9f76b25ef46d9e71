"""What one ingest batch costs: the job alone, fed a steady rate, Spark's own per-batch timings.

    python -m bench.ingest_batches [--bootstrap 127.0.0.1:9092] [--redis redis://...]
                                   [--rate 200] [--seconds 30] [--producer-share 0.0]

The ingest job (this repo's query, ``local[2]``, default settings, its own checkpoint) reads a
fresh 6-partition ingest topic while this process writes ``--rate`` messages a second to it for
``--seconds`` (1,000 groups; ``--producer-share`` of them with producer ids). Reported: the
median and max over the last 60 batches of each part of Spark's ``durationMs`` (``addBatch`` is
the de-duplication and the write; ``triggerExecution`` the whole batch), and the cores this
process and its children (the JVM, the Python workers) kept busy meanwhile.

docs/latency.md uses it to measure changes to the batch itself, apart from the rest of the
stack. Figures are printed and written as JSON under bench/results/.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import uuid
from typing import Any

import redis
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from bench.ingest import create_topics
from bench.latency import tree_cpu_s
from bench.machine import quiet_client_logs, quiet_kafka_config, service_arguments, write_result
from cli.jars import resolve_spark_jars
from setu import names
from setu.envelope import Envelope
from setu.settings import Settings
from spark import job
from spark.marks import MarkPublisher

PARTITIONS = 6
GROUPS = 1_000
BODY = b"x" * 200


def feed(bootstrap: str, topic: str, rate: float, seconds: float, producer_share: float) -> int:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 1, **quiet_kafka_config()})
    every = round(1 / producer_share) if producer_share > 0 else 0
    start, n = time.monotonic(), 0
    while time.monotonic() - start < seconds:
        delay = start + n / rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        envelope = Envelope(
            f"m{n}", BODY, group_id=f"g{n % GROUPS}", produced_at_ms=int(time.time() * 1000)
        )
        if every and n % every == 0:
            envelope = envelope.evolve(producer_id=f"p{n % 7}", sequence_id=n)
        headers: list[tuple[str, str | bytes | None]] = list(envelope.kafka_headers())
        producer.produce(topic, envelope.body, key=envelope.key, headers=headers)
        producer.poll(0)
        n += 1
    producer.flush(30)
    return n


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    service_arguments(parser)
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--producer-share", type=float, default=0.0)
    args = parser.parse_args(argv)
    quiet_client_logs()
    project = f"batches{uuid.uuid4().hex[:8]}"
    ingest = names.ingest_topic(project, "t")
    admin = AdminClient({"bootstrap.servers": args.bootstrap})
    create_topics(admin, [ingest, names.main_topic(project, "t")], PARTITIONS)
    with tempfile.TemporaryDirectory(prefix="setu-batches-") as work:
        base = Settings(kafka_bootstrap=args.bootstrap, redis_url=args.redis)
        settings = base.model_copy(
            update={
                "spark_jars": ",".join(map(str, resolve_spark_jars(base))),
                "spark_checkpoint_dir": f"{work}/checkpoint",
            }
        )
        spark = job.build_session(settings)
        spark.sparkContext.setLogLevel("ERROR")
        publisher = MarkPublisher(redis.Redis.from_url(args.redis))
        query = job.start(spark, settings, publisher, job.project_pattern(project))
        time.sleep(8)  # the query's first (empty) batches and Spark's warm-up
        cpu_before, started = tree_cpu_s(os.getpid()), time.monotonic()
        sent = feed(args.bootstrap, ingest, args.rate, args.seconds, args.producer_share)
        cores = (tree_cpu_s(os.getpid()) - cpu_before) / (time.monotonic() - started)
        time.sleep(3)
        progress = [p for p in query.recentProgress if p.get("numInputRows", 0) > 0][-60:]
        job.stop_between_batches(query)
        spark.stop()
    parts: dict[str, Any] = {}
    for name in sorted({k for p in progress for k in p["durationMs"]}):
        values = [p["durationMs"].get(name, 0) for p in progress]
        parts[name] = {"p50_ms": statistics.median(values), "max_ms": max(values)}
    figures = {
        "settings": vars(args),
        "sent": sent,
        "batches": len(progress),
        "rows_per_batch_p50": statistics.median(p["numInputRows"] for p in progress),
        "cores_busy": round(cores, 2),
        "duration_ms": parts,
    }
    for name, part in parts.items():
        print(f"{name:<20} p50 {part['p50_ms']:>7.0f} ms   max {part['max_ms']:>7.0f} ms")
    rows = figures["rows_per_batch_p50"]
    print(f"cores busy {cores:.2f}, {len(progress)} batches, {rows} rows each")
    path = write_result("ingest-batches", figures, f"-{args.label}" if args.label else "")
    print(f"written to {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
