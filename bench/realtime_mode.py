"""What Spark's real-time mode gives a Kafka-to-Kafka copy, and what one Python step does to it.

    python -m bench.realtime_mode --bootstrap 127.0.0.1:9092
                                  [--mode k2k|pandas|udf|foreach|fbatch|dedup]
                                  [--allow-python] [--trigger realtime|micro] [--resend 0.05]
                                  [--rate 200] [--seconds 30] [--partitions 2]
                                  [--master local[2]] [--label X]

One query, ``trigger(realTime="5 seconds")`` in output mode update, reads a fresh source topic
of ``--partitions`` partitions from its first offset and writes a fresh one-partition output
topic, while this process sends ``--rate`` records a second for ``--seconds``, each carrying its
send time. ``--mode`` chooses what sits between the source and the output topic:

* ``k2k``: nothing: Spark's Kafka source and sink only.
* ``pandas``: a ``mapInPandas`` step; ``udf``: a Python ``@udf`` in a select. Both stamp each
  row with the time the Python function saw it.
* ``foreach``: a Python ``foreach`` sink that stamps each row and sends it to the output topic.
* ``fbatch``: a ``foreachBatch`` function that stamps each batch and writes it there.
* ``dedup``: the ingest job's de-duplication operator (``setu.ingest.IngestDedup``, a JVM
  ``transformWithState`` grouped by source partition; cli/jvm.py builds it), every record
  under one producer with its id as sequence and ``--resend`` of them sent twice.

``--trigger micro`` runs the same query in micro-batches (trigger 0) instead, for the
comparison.

Spark refuses Python operators (at the query's first batch) and ``foreachBatch`` (at
``start()``) in real-time mode while its allowlist check is on; ``--allow-python`` sets
``spark.sql.streaming.realTimeMode.allowlistCheck=false``. A refusal is a result: its message is
reported. Otherwise reported: end-to-end latency (send time to arrival in the output topic, both
from this host's clock) p50/p95/p99/max; for Python steps also send time to the Python function;
records delivered and duplicated; Spark's batch count and median batch duration.

Real-time mode runs every source partition's task for the whole batch: ``--master local[N]``
needs N >= ``--partitions``, else the partitions beyond the cores wait for the next batch, with
no error. The topics are deleted at the end; the broker must be on a loopback address. Figures
are printed and written as JSON under bench/results/.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import random
import re
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pandas as pd
from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka.admin import AdminClient
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as fn
from pyspark.sql.streaming.listener import StreamingQueryProgress
from pyspark.sql.streaming.query import StreamingQuery
from pyspark.sql.streaming.readwriter import DataStreamWriter

from bench.http_load import percentile
from bench.ingest import create_topics
from bench.machine import quiet_client_logs, quiet_kafka_config, service_arguments, write_result
from cli.jars import resolve_spark_jars
from cli.jvm import ingest_jar
from setu.settings import Settings

MODES = ("k2k", "pandas", "udf", "foreach", "fbatch", "dedup")
REAL_TIME_S = 5
ALLOWLIST_CHECK = "spark.sql.streaming.realTimeMode.allowlistCheck"
LOOPBACK = "127.0.0.1"
# Query start to the end of the first (time-bound) batch, or to a refusal at that batch.
FIRST_BATCH_TIMEOUT_S = 60.0
# Batches ended before the measured records are sent.
WARM_BATCHES = 2
# After the last send: a Python step holds rows for up to a whole batch, so allow a few.
DRAIN_TIMEOUT_S = 4.0 * REAL_TIME_S
# Producing on past the planned time only happens on an overloaded machine; it is cut short.
FEED_GRACE_S = 10.0
# Spark's own messages: "[ERROR_CLASS] reason ... SQLSTATE: 0A000", then a stack trace.
SPARK_MESSAGE = re.compile(r"\[[A-Z][A-Z_.]*\].*?SQLSTATE: \w+", re.DOTALL)


@dataclass(frozen=True)
class Topics:
    source: str
    output: str


@dataclass(frozen=True)
class Arrival:
    """One output record: its id, send -> arrival and (for Python steps) send -> Python."""

    record_id: int
    end_to_end_s: float
    to_python_s: float | None


def is_loopback(bootstrap: str) -> bool:
    """True when every ``host:port`` of the bootstrap list names this machine."""
    for entry in bootstrap.split(","):
        host = entry.strip().rsplit(":", 1)[0].strip("[]")
        if host == "localhost":
            continue
        try:
            if not ipaddress.ip_address(host).is_loopback:
                return False
        except ValueError:
            return False
    return True


def spark_message(text: str) -> str:
    """Spark's error class and reason out of an exception's text, without the stack trace."""
    match = SPARK_MESSAGE.search(text)
    if match:
        return " ".join(match.group(0).split())
    lines = text.strip().splitlines()
    return lines[0][:1000] if lines else ""


def arrival(value: bytes, arrived: float) -> Arrival:
    """Times one output record. A Python step wraps the sent record as ``{"value", "seen"}``."""
    record = json.loads(value)
    if "seen" not in record:
        return Arrival(record["id"], arrived - record["ts"], None)
    sent = json.loads(record["value"])
    return Arrival(sent["id"], arrived - sent["ts"], record["seen"] - sent["ts"])


def distribution_ms(seconds: list[float]) -> dict[str, float]:
    """Nearest-rank p50/p95/p99 and max, in milliseconds (zeros when empty)."""
    ordered = sorted(s * 1000 for s in seconds)
    return {
        "p50_ms": round(percentile(ordered, 0.50), 1),
        "p95_ms": round(percentile(ordered, 0.95), 1),
        "p99_ms": round(percentile(ordered, 0.99), 1),
        "max_ms": round(ordered[-1] if ordered else 0.0, 1),
    }


def delivery_figures(arrivals: list[Arrival], sent: int) -> dict[str, Any]:
    delivered = len({a.record_id for a in arrivals})
    to_python = [a.to_python_s for a in arrivals if a.to_python_s is not None]
    figures: dict[str, Any] = {
        "sent": sent,
        "delivered": delivered,
        "duplicates": len(arrivals) - delivered,
        "end_to_end": distribution_ms([a.end_to_end_s for a in arrivals]),
    }
    if to_python:
        figures["send_to_python"] = distribution_ms(to_python)
    return figures


def batch_figures(progress: list[StreamingQueryProgress]) -> dict[str, Any]:
    durations = [p["durationMs"].get("triggerExecution", 0) for p in progress]
    return {
        "batches": len(progress),
        "batch_ms_p50": statistics.median(durations) if durations else None,
    }


# Run in Spark's Python workers: the standard library, pandas and confluent-kafka only.


def stamp_frames(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
    """``mapInPandas``: each frame's rows with the time the function got the frame."""
    for frame in frames:
        yield frame.assign(seen=time.time())


def stamp_value(value: str) -> str:
    """``@udf``: the row's value wrapped with the time the function got the row."""
    return json.dumps({"value": value, "seen": time.time()})


class StampingWriter:
    """A ``foreach`` sink: each row, stamped when ``process()`` gets it, to the output topic.

    One producer per partition and epoch (Spark opens and closes the writer at every batch);
    ``close()`` waits for its records to be acknowledged."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.producer: Any = None

    def open(self, partition_id: int, epoch_id: int) -> bool:
        # Imported here: Spark ships this object to its Python workers by value, and the Kafka
        # client's type does not survive that.
        from confluent_kafka import Producer as WorkerProducer

        self.producer = WorkerProducer({"bootstrap.servers": self.bootstrap, "linger.ms": 0})
        return True

    def process(self, row: Row) -> None:
        assert self.producer is not None, "Spark calls open() first"
        self.producer.produce(self.topic, key=row.key, value=stamp_value(row.value))
        self.producer.poll(0)

    def close(self, error: Exception | None) -> None:
        if self.producer is not None:
            self.producer.flush(30)
            self.producer = None


@dataclass(frozen=True)
class BatchCopy:
    """A ``foreachBatch`` function: the batch, stamped when the function is called (on the
    driver), written to the output topic."""

    bootstrap: str
    topic: str

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        seen = fn.lit(time.time()).alias("seen")
        stamped = batch.select("key", fn.to_json(fn.struct("value", seen)).alias("value"))
        kafka = stamped.write.format("kafka").option("kafka.bootstrap.servers", self.bootstrap)
        kafka.option("topic", self.topic).save()


def session_config(master: str, jars: str, allow_python: bool, name: str) -> dict[str, str]:
    conf = {
        "spark.master": master,
        "spark.app.name": name,
        "spark.jars": jars,
        "spark.driver.host": LOOPBACK,
        "spark.driver.bindAddress": LOOPBACK,
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "2",
    }
    if allow_python:
        conf[ALLOWLIST_CHECK] = "false"
    return conf


def build_session(conf: dict[str, str]) -> SparkSession:
    builder = SparkSession.builder
    for key, value in conf.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def output_frame(spark: SparkSession, bootstrap: str, topic: str, mode: str) -> DataFrame:
    """The source topic as key and value strings, through the mode's Python step if any."""
    source = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .load()
    )
    if mode == "dedup":
        return deduplicated(spark, source)
    rows = source.selectExpr("CAST(key AS STRING) key", "CAST(value AS STRING) value")
    if mode == "pandas":
        stamped = rows.mapInPandas(stamp_frames, "key string, value string, seen double")
        return stamped.select("key", fn.to_json(fn.struct("value", "seen")).alias("value"))
    if mode == "udf":
        stamp = fn.udf(stamp_value, "string")
        return rows.select("key", stamp("value").alias("value"))
    return rows


def deduplicated(spark: SparkSession, source: DataFrame) -> DataFrame:
    """The source records through the ingest job's JVM de-duplication operator, as key and
    value strings: one producer, sequence = the record's id (a resend repeats it)."""
    value = fn.col("value").cast("string")
    rows = source.select(
        "topic",
        "partition",
        fn.lit("bench").alias("producer"),
        fn.get_json_object(value, "$.id").cast("bigint").alias("seq"),
        fn.lit(0).cast("bigint").alias("incarnation"),
        fn.unix_millis("timestamp").alias("record_ms"),
        fn.col("key").cast("string").alias("message_id"),
        fn.lit(0).cast("bigint").alias("window_ms"),
        fn.col("key").cast("string").alias("key"),
        value.alias("value"),
    )
    operator = spark._jvm.setu.ingest.IngestDedup  # type: ignore[union-attr]
    kept = DataFrame(operator.apply(rows._jdf, None, 3_600_000, 100_000, 100_000, None), spark)
    return kept.select("key", "value")


def start_query(
    frame: DataFrame, mode: str, bootstrap: str, topic: str, checkpoint: str, micro: bool = False
) -> StreamingQuery:
    """Starts the real-time query (``micro``: micro-batches, trigger 0 instead). Raises
    PySparkException when Spark refuses its sink."""
    updates = frame.writeStream.outputMode("update").option("checkpointLocation", checkpoint)
    # pyspark 4.2's typed overloads of trigger() leave out realTime, which it takes.
    interval = f"{REAL_TIME_S} seconds"
    writer: DataStreamWriter = (
        updates.trigger(processingTime="0 seconds") if micro else updates.trigger(realTime=interval)  # type: ignore[call-overload]
    )
    if mode == "foreach":
        return writer.foreach(StampingWriter(bootstrap, topic)).start()
    if mode == "fbatch":
        return writer.foreachBatch(BatchCopy(bootstrap, topic)).start()
    kafka = writer.format("kafka").option("kafka.bootstrap.servers", bootstrap)
    return kafka.option("topic", topic).start()


class OutputReader:
    """Reads the output topic from its start on a thread, timing each record as it arrives."""

    def __init__(self, consumer: Consumer, topic: str) -> None:
        self.arrivals: list[Arrival] = []
        self.ids: set[int] = set()
        self._consumer = consumer
        self._topic = topic
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="output-reader", daemon=True)

    def start(self) -> None:
        self._consumer.subscribe([self._topic])
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            message = self._consumer.poll(0.2)
            value = message.value() if message is not None and not message.error() else None
            if value is None:
                continue
            record = arrival(value, time.time())
            self.arrivals.append(record)
            self.ids.add(record.record_id)

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10)
        self._consumer.close()


def output_consumer(bootstrap: str, group: str) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            **quiet_kafka_config(),
        }
    )


def feed(
    producer: Producer,
    topic: str,
    partitions: int,
    rate: float,
    seconds: float,
    resend: float = 0.0,
) -> int:
    """Sends ``rate * seconds`` records ``{"id", "ts"}`` evenly over the partitions, a
    ``resend`` fraction of them twice; returns how many the broker acknowledged (about)."""
    total = round(rate * seconds)
    start = time.monotonic()
    deadline = start + seconds + FEED_GRACE_S
    sent = resent = 0
    for n in range(total):
        delay = start + n / rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        elif time.monotonic() > deadline:
            break
        record = json.dumps({"id": n, "ts": time.time()})
        producer.produce(topic, key=str(n), value=record, partition=n % partitions)
        if resend and random.random() < resend:
            producer.produce(topic, key=str(n), value=record, partition=n % partitions)
            resent += 1
        producer.poll(0)
        sent += 1
    return sent - max(0, producer.flush(30) - resent)


def wait_warm(query: StreamingQuery) -> None:
    """Returns once the query has ended :data:`WARM_BATCHES` batches, or has stopped (a
    refusal, say): the first batches run cold, and would count in the figures."""
    deadline = time.monotonic() + FIRST_BATCH_TIMEOUT_S + WARM_BATCHES * REAL_TIME_S
    while query.isActive and len(query.recentProgress) < WARM_BATCHES:
        if time.monotonic() > deadline:
            raise SystemExit(f"the query did not end {WARM_BATCHES} batches in time")
        time.sleep(0.2)


def wait_delivered(reader: OutputReader, sent: int, query: StreamingQuery) -> None:
    deadline = time.monotonic() + DRAIN_TIMEOUT_S
    while len(reader.ids) < sent and query.isActive and time.monotonic() < deadline:
        time.sleep(0.2)


def query_error(query: StreamingQuery, at: str) -> dict[str, str] | None:
    error = query.exception()
    return {"at": at, "message": spark_message(str(error))} if error else None


def measure(args: argparse.Namespace, query: StreamingQuery, topics: Topics) -> dict[str, Any]:
    """Feeds the running query and times its output; a query that fails instead says why."""
    reader = OutputReader(output_consumer(args.bootstrap, topics.output), topics.output)
    reader.start()
    try:
        wait_warm(query)
        refused = query_error(query, "first batch")
        if refused:
            return {"query_error": refused}
        producer = Producer({"bootstrap.servers": args.bootstrap, "linger.ms": 0})
        sent = feed(producer, topics.source, args.partitions, args.rate, args.seconds, args.resend)
        wait_delivered(reader, sent, query)
        return {
            "query_error": query_error(query, "run"),
            **delivery_figures(list(reader.arrivals), sent),
            **batch_figures(query.recentProgress),
        }
    finally:
        reader.close()


def probe(args: argparse.Namespace, topics: Topics, name: str) -> dict[str, Any]:
    """Runs the mode's query in its own session and checkpoint; both are gone on return."""
    settings = Settings(kafka_bootstrap=args.bootstrap)
    jars = ",".join(map(str, [*resolve_spark_jars(settings), ingest_jar(settings)]))
    with tempfile.TemporaryDirectory(prefix="setu-realtime-") as work:
        spark = build_session(session_config(args.master, jars, args.allow_python, name))
        try:
            spark.sparkContext.setLogLevel("ERROR")
            frame = output_frame(spark, args.bootstrap, topics.source, args.mode)
            try:
                query = start_query(
                    frame, args.mode, args.bootstrap, topics.output, work, args.trigger == "micro"
                )
            except PySparkException as error:
                return {"query_error": {"at": "start", "message": spark_message(str(error))}}
            try:
                return measure(args, query, topics)
            finally:
                # Stopping interrupts the running real-time batch: Spark logs that as errors.
                spark.sparkContext.setLogLevel("OFF")
                query.stop()
        finally:
            spark.stop()


def delete_topics(admin: AdminClient, topics: Topics) -> None:
    futures = admin.delete_topics([topics.source, topics.output], operation_timeout=30)
    for topic, future in futures.items():
        try:
            future.result(timeout=60)
        except KafkaException as error:
            print(f"could not delete topic {topic}: {error}")


def print_figures(figures: dict[str, Any]) -> None:
    s = figures["settings"]
    check = "off" if s["allow_python"] else "on"
    print(f"mode {s['mode']} ({s['trigger']}), allowlist check {check}, ", end="")
    print(f"{s['partitions']} source partitions, {s['master']}, ", end="")
    print(f"{s['rate']:g}/s for {s['seconds']:g} s")
    error = figures.get("query_error")
    if error:
        verb = "failed during the run" if error["at"] == "run" else f"refused at {error['at']}"
        print(f"query {verb}: {error['message']}")
    if "sent" not in figures:
        return
    print(f"sent {figures['sent']}, delivered {figures['delivered']} ", end="")
    print(f"({figures['duplicates']} duplicates), {figures['batches']} batches, ", end="")
    print(f"median batch {figures['batch_ms_p50']} ms")
    for name, label in (("end_to_end", "end-to-end"), ("send_to_python", "send -> Python")):
        if name in figures:
            d = figures[name]
            print(f"{label:<15} p50 {d['p50_ms']:>8.1f} ms  p95 {d['p95_ms']:>8.1f} ms  ", end="")
            print(f"p99 {d['p99_ms']:>8.1f} ms  max {d['max_ms']:>8.1f} ms")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    service_arguments(parser)
    parser.add_argument("--mode", choices=MODES, default="k2k")
    parser.add_argument("--allow-python", action="store_true", help=f"set {ALLOWLIST_CHECK}=false")
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--trigger", choices=("realtime", "micro"), default="realtime")
    parser.add_argument("--resend", type=float, default=0.0, help="fraction of records sent twice")
    args = parser.parse_args(argv)
    if not is_loopback(args.bootstrap):
        parser.error(f"--bootstrap {args.bootstrap}: only loopback brokers")
    if args.rate <= 0 or args.seconds <= 0 or args.partitions < 1:
        parser.error("--rate and --seconds must be positive, --partitions at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    quiet_client_logs()
    run = f"realtime{uuid.uuid4().hex[:8]}"
    topics = Topics(source=f"bench.{run}.source", output=f"bench.{run}.output")
    admin = AdminClient({"bootstrap.servers": args.bootstrap, **quiet_kafka_config()})
    try:
        create_topics(admin, [topics.source], args.partitions)
        create_topics(admin, [topics.output], 1)
        measured = probe(args, topics, run)
    finally:
        delete_topics(admin, topics)
    settings = {
        "mode": args.mode,
        "allow_python": args.allow_python,
        "real_time": f"{REAL_TIME_S} seconds",
        "rate": args.rate,
        "seconds": args.seconds,
        "partitions": args.partitions,
        "master": args.master,
        "trigger": args.trigger,
        "resend": args.resend,
    }
    figures = {"settings": settings, **measured}
    print_figures(figures)
    path = write_result("realtime-mode", figures, f"-{args.label}" if args.label else "")
    print(f"written to {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
