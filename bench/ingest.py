"""Ingest job benchmark: throughput with duplicates, a plain copy as the limit, added latency.

    python -m bench.ingest [--bootstrap 127.0.0.1:9092] [--redis redis://127.0.0.1:6379/0]
                           [--messages 1000000] [--partitions 6] [--rate 1000] [--seconds 30]
                           [--mode real-time|micro-batch]

1. ``--messages`` records (10% of them retries of an earlier record: same ids, same sequence)
   from 100 producers over 10,000 groups are written to one ingest topic before any query runs.
2. The ingest job (``spark.job.serve``, default settings, in ``--mode``) reads them all; rate =
   records in the main log / (time its last record appeared - time its first did), by its end
   offsets. Its main log must then hold exactly the 90% unique messages.
3. Before it, a plain Spark Kafka-to-Kafka copy in micro-batches (same source and sink options,
   no dedup, no ordering) reads the same records, its rate measured the same way: the limit on
   this machine.
4. With the job still running, a steady ``--rate`` messages/s for ``--seconds`` go to a second
   topic; added latency = main-log append time - ingest append time (both topics use
   LogAppendTime, so both come from the broker's clock).

Targets (2-core machine): >= 20,000 messages/s, >= 0.6 of the plain copy, p99 latency <= 1.5 s.
Figures are printed and written as JSON under bench/results/.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import redis
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic
from pyspark.sql import SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from bench.machine import quiet_client_logs, quiet_kafka_config, service_arguments, write_result
from cli.jars import resolve_spark_jars
from cli.jvm import ingest_jar
from setu import names
from setu.envelope import Envelope
from setu.producer_settings import durable_producer
from setu.settings import Settings
from spark import job
from state import keys

PRODUCERS = 100
GROUPS = 10_000
DUPLICATE_EVERY = 10
TIMESTAMPS = {"message.timestamp.type": "LogAppendTime"}


def create_topics(admin: AdminClient, topics: list[str], partitions: int) -> None:
    futures = admin.create_topics([NewTopic(t, partitions, 1, config=TIMESTAMPS) for t in topics])
    for future in futures.values():
        future.result(timeout=30)


def new_producer(bootstrap: str, **extra: Any) -> Producer:
    conf = {
        **quiet_kafka_config(),
        **durable_producer(bootstrap),
        "linger.ms": 20,
        "queue.buffering.max.messages": 1_000_000,
    }
    conf.update(extra)
    return Producer(conf)


def produce(producer: Producer, topic: str, envelope: Envelope) -> None:
    while True:
        try:
            headers: list[tuple[str, str | bytes | None]] = list(envelope.kafka_headers())
            producer.produce(topic, envelope.body, key=envelope.key, headers=headers)
            return
        except BufferError:
            producer.poll(0.05)


def write_backlog(bootstrap: str, topic: str, messages: int) -> int:
    """``messages`` records, every 10th a retry of the one before it; returns unique count."""
    producer = new_producer(bootstrap, **{"batch.num.messages": 10_000})
    body = b"x" * 200
    unique = 0
    sequence = [0] * PRODUCERS
    previous: Envelope | None = None
    for i in range(messages):
        if i % DUPLICATE_EVERY == DUPLICATE_EVERY - 1 and previous is not None:
            envelope = previous
        else:
            p = unique % PRODUCERS
            envelope = Envelope(
                message_id=f"m{unique}",
                body=body,
                group_id=f"g{(unique * 7919) % GROUPS}",
                producer_id=f"producer-{p}",
                sequence_id=sequence[p],
            )
            sequence[p] += 1
            unique += 1
            previous = envelope
        produce(producer, topic, envelope)
        if i % 10_000 == 0:
            producer.poll(0)
    producer.flush()
    return unique


def end_offsets(bootstrap: str, topic: str, partitions: int) -> int:
    consumer = Consumer(
        {
            **quiet_kafka_config(),
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-{uuid.uuid4().hex}",
        }
    )
    total = sum(
        consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
        for p in range(partitions)
    )
    consumer.close()
    return total


def rate_of(
    bootstrap: str, topic: str, partitions: int, expected: int, timeout_s: float = 900
) -> dict[str, Any]:
    """Waits until ``topic`` holds ``expected`` records; the rate is measured from its first
    record to its last, both seen by polling its end offsets every 0.2 s (the same for the job,
    whatever its mode, and for the plain copy)."""
    deadline = time.monotonic() + timeout_s
    first: float | None = None
    held = 0
    while time.monotonic() < deadline:
        held = end_offsets(bootstrap, topic, partitions)
        now = time.monotonic()
        if held and first is None:
            first = now
        if held >= expected:
            break
        time.sleep(0.2)
    else:
        raise TimeoutError(f"{topic} holds {held} records, not {expected}")
    assert first is not None
    seconds = max(now - first, 0.2)
    return {"records": held, "seconds": round(seconds, 2), "messages_per_s": round(held / seconds)}


def plain_copy(spark: SparkSession, settings: Settings, source: str, target: str) -> StreamingQuery:
    options = job.source_options(settings, f"^{source.replace('.', '[.]')}$")
    return (
        spark.readStream.format("kafka")
        .options(**options)
        .load()
        .select("key", "value", "headers")
        .writeStream.queryName("plain-copy")
        .format("kafka")
        .options(**job.sink_options(settings))
        .option("topic", target)
        .option("checkpointLocation", str(Path(settings.resolved_checkpoint_dir()) / "copy"))
        .trigger(processingTime=f"{settings.spark_trigger_ms} milliseconds")
        .start()
    )


def steady_latency(
    bootstrap: str, project: str, topic: str, partitions: int, rate: int, seconds: int
) -> dict[str, Any]:
    """Produce ``rate``/s for ``seconds``; latency = main append - ingest append, per message."""
    ingest, main = names.ingest_topic(project, topic), names.main_topic(project, topic)
    producer = new_producer(bootstrap, **{"linger.ms": 1})
    total = rate * seconds
    started = time.monotonic()
    for i in range(total):
        produce(
            producer,
            ingest,
            Envelope(
                message_id=f"s{i}",
                body=b"y" * 200,
                group_id=f"g{i % 1000}",
                producer_id=f"steady-{i % 10}",
                sequence_id=i // 10,
            ),
        )
        producer.poll(0)
        ahead = started + (i + 1) / rate - time.monotonic()
        if ahead > 0:
            time.sleep(ahead)
    producer.flush()
    ingest_ts = _timestamps(
        bootstrap, ingest, partitions, total, lambda m: (m.partition(), m.offset())
    )
    main_ts = _timestamps(bootstrap, main, partitions, total, _ingest_position)
    added = sorted(main_ts[k] - ingest_ts[k] for k in main_ts)
    return {
        "messages": len(added),
        "rate_per_s": rate,
        "p50_ms": added[len(added) // 2],
        "p99_ms": added[int(len(added) * 0.99) - 1],
        "max_ms": added[-1],
        "mean_ms": round(statistics.fmean(added), 1),
    }


def _ingest_position(message: Any) -> tuple[int, int]:
    envelope = Envelope.from_kafka(message.headers(), message.value())
    assert envelope.ingest_partition is not None and envelope.ingest_offset is not None
    return envelope.ingest_partition, envelope.ingest_offset


def _timestamps(
    bootstrap: str, topic: str, partitions: int, count: int, key: Any, timeout_s: float = 120
) -> dict[tuple[int, int], int]:
    consumer = Consumer(
        {
            **quiet_kafka_config(),
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-{uuid.uuid4().hex}",
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    out: dict[tuple[int, int], int] = {}
    deadline = time.monotonic() + timeout_s
    while len(out) < count and time.monotonic() < deadline:
        for message in consumer.consume(5000, timeout=0.5):
            if message.error() is None:
                out[key(message)] = message.timestamp()[1]
    consumer.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    service_arguments(parser)
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--rate", type=int, default=1000)
    parser.add_argument("--seconds", type=int, default=30)
    parser.add_argument(
        "--mode", choices=("real-time", "micro-batch"), default="real-time", help="SETU_INGEST_MODE"
    )
    args = parser.parse_args()
    quiet_client_logs()

    project = f"bench-{uuid.uuid4().hex[:8]}"
    work = Path(tempfile.mkdtemp(prefix="setu-bench-ingest-"))
    admin = AdminClient({"bootstrap.servers": args.bootstrap})
    topics = [names.ingest_topic(project, t) for t in ("load", "steady")]
    topics += [names.main_topic(project, t) for t in ("load", "steady")] + [f"{project}-copy"]
    create_topics(admin, topics, args.partitions)
    client = redis.Redis.from_url(args.redis)
    try:
        t = time.monotonic()
        unique = write_backlog(args.bootstrap, names.ingest_topic(project, "load"), args.messages)
        print(
            f"wrote {args.messages} ingest records ({unique} unique) in {time.monotonic() - t:.1f}s"
        )

        base = Settings(kafka_bootstrap=args.bootstrap, redis_url=args.redis)
        settings = base.model_copy(
            update={
                "spark_jars": ",".join(map(str, [*resolve_spark_jars(base), ingest_jar(base)])),
                "spark_checkpoint_dir": str(work / "checkpoint"),
                "spark_ingest_pattern": job.project_pattern(project),
                "ingest_mode": args.mode,
            }
        )
        spark = job.build_session(settings)
        spark.sparkContext.setLogLevel("ERROR")

        copy = plain_copy(spark, settings, names.ingest_topic(project, "load"), f"{project}-copy")
        copied = rate_of(args.bootstrap, f"{project}-copy", args.partitions, args.messages)
        job.stop_between_batches(copy)
        print(f"plain copy: {copied}")

        main_load = names.main_topic(project, "load")
        with job.serving(spark, settings, client):
            ingested = rate_of(args.bootstrap, main_load, args.partitions, unique)
            main_count = end_offsets(args.bootstrap, main_load, args.partitions)
            print(f"ingest job: {ingested}; main log holds {main_count} (want {unique})")
            latency = steady_latency(
                args.bootstrap, project, "steady", args.partitions, args.rate, args.seconds
            )
        spark.stop()
        print(f"added latency at {args.rate}/s: {latency}")

        result = {
            "benchmark": "ingest",
            "settings": {
                "mode": args.mode,
                "trigger_ms": settings.spark_trigger_ms,
                "max_offsets_per_trigger": settings.spark_max_offsets_per_trigger,
                "partitions": args.partitions,
            },
            "messages": args.messages,
            "unique": unique,
            "main_log_records": main_count,
            "ingest": ingested,
            "plain_copy": copied,
            "ratio_to_copy": round(ingested["messages_per_s"] / copied["messages_per_s"], 2),
            "latency": latency,
            "targets": {
                "messages_per_s": ingested["messages_per_s"] >= 20_000,
                "ratio_to_copy": ingested["messages_per_s"] >= 0.6 * copied["messages_per_s"],
                "p99_ms": latency["p99_ms"] <= 1500,
                "exact_output": main_count == unique,
            },
        }
        out = write_result("ingest", result, f"-{args.label}" if args.label else "")
        print(json.dumps(result, indent=2))
        print(f"written to {out}")
    finally:
        admin.delete_topics(topics)
        for name in client.scan_iter(f"{keys.PREFIX}:producers:{{{project}.*"):
            client.delete(name)
        client.close()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
