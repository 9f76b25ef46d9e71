"""Helpers of the ingest job's tests (the fixtures in conftest.py build them): a world of one
project on the shared broker, and a reader of its main logs."""

from __future__ import annotations

import json
import os
import sys
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from pyspark.sql import SparkSession

from cli.processes import Child, ChildSpec
from setu import names
from setu.envelope import H_TOPIC, Envelope
from setu.limits import DEFAULT_MAX_MESSAGE_BYTES, MessageLimits
from setu.model import Topic
from setu.settings import Settings
from spark import job
from spark.dedup import ProducerMark, encode_marks
from spark.dedup_state import PartitionMarks
from spark.metrics import IngestMetrics
from state import keys
from state.kafka_admin import KafkaTopics
from state.producer_marks import parse_mark
from tests import waiting
from tests.kafka_topics import partitions_of


def wait_for(what: str, condition: Callable[[], object], timeout_s: float = 90.0) -> None:
    """:func:`tests.waiting.wait_for` with the patience a Spark batch needs on two cores; a
    timeout also names what the session's streaming queries were doing (CI keeps only the
    failure's first lines)."""
    try:
        waiting.wait_for(what, condition, timeout_s, every_s=0.2)
    except pytest.fail.Exception as failed:
        raise pytest.fail.Exception(f"{failed.msg}; {queries_now()}") from None


def queries_now() -> str:
    """The active session's streaming queries: status, last progress and failure, in brief."""
    spark = SparkSession.getActiveSession()
    if spark is None:
        return "no active Spark session"
    described = []
    for query in spark.streams.active:
        progress: dict[str, object] = query.lastProgress or {}
        failure = query.exception()
        described.append(
            f"query {query.name or query.id}: {query.status.get('message')}, batch "
            f"{progress.get('batchId')} at {progress.get('timestamp')} with "
            f"{progress.get('numInputRows')} rows"
            + (f", failed: {str(failure)[:300]}" if failure else "")
        )
    return "; ".join(described) or "no active streaming query"


def ingest_child(
    world: IngestWorld,
    tmp_path: Path,
    *,
    master: str,
    pattern: str,
    conf: Mapping[str, str],
    mode: str = "real-time",
    metrics_port: int | None = None,
    env: Mapping[str, str] | None = None,
) -> ChildSpec:
    """``setu ingest`` as a process of its own on ``world``'s broker and Redis, reading the
    ingest topics ``pattern`` matches, on the Spark ``master`` with ``conf``, in ``mode``
    (``SETU_INGEST_MODE``), serving its metrics on ``metrics_port`` if given, with more
    ``env``."""
    variables = {
        **os.environ,
        "SETU_KAFKA_BOOTSTRAP": world.bootstrap,
        "SETU_REDIS_URL": world.redis_url,
        "SETU_DATA_DIR": str(tmp_path / "data"),
        "SETU_SPARK_MASTER": master,
        "SETU_SPARK_CHECKPOINT_DIR": str(tmp_path / "checkpoint"),
        "SETU_SPARK_INGEST_PATTERN": pattern,
        "SETU_SPARK_TRIGGER_MS": "200",
        # Real-time batches of 30 s, not the default 120: tests that restart the job wait for
        # a committed batch, and shorter batches commit sooner (the records flow alike).
        "SETU_SPARK_REALTIME_BATCH_S": "30",
        "SETU_SPARK_CONF": json.dumps(dict(conf)),
        "SETU_INGEST_MODE": mode,
    }
    if metrics_port is not None:
        variables["SETU_INGEST_METRICS_PORT"] = str(metrics_port)
    variables.update(env or {})
    argv = (sys.executable, "-m", "cli.main", "ingest")
    return ChildSpec("ingest", argv, tmp_path / "logs" / "ingest.log", env=variables)


def run_ingest(
    world: IngestWorld,
    tmp_path: Path,
    mode: str = "real-time",
    metrics_port: int | None = None,
    env: dict[str, str] | None = None,
    pattern: str | None = None,
) -> Child:
    """``setu ingest`` started on the ingest topics of ``world``'s project (``pattern``)."""
    spec = ingest_child(
        world,
        tmp_path,
        master="local[2]",
        pattern=pattern or job.project_pattern(world.project),
        conf={},
        mode=mode,
        metrics_port=metrics_port,
        env=env,
    )
    child = Child(spec)
    child.start()
    return child


@dataclass
class MainLog:
    """Everything read so far from one main topic, in per-partition log order."""

    consumer: Consumer
    records: list[tuple[int, bytes, Envelope]] = field(default_factory=list)
    raw_headers: list[list[tuple[str, bytes]]] = field(default_factory=list)

    def poll(self) -> None:
        for message in self.consumer.consume(1000, timeout=0.2):
            if message.error() is None:
                envelope = Envelope.from_kafka(message.headers(), message.value())
                self.records.append((message.partition(), message.key(), envelope))
                self.raw_headers.append(list(message.headers() or []))

    def ids(self) -> list[str]:
        return [e.message_id for _, _, e in self.records]

    def read_ids(self) -> set[str]:
        """The ids read so far, after reading what is there now."""
        self.poll()
        return set(self.ids())

    def wait_for_ids(self, wanted: set[str], timeout_s: float = 120.0) -> None:
        def arrived() -> bool:
            self.poll()
            return wanted <= set(self.ids())

        wait_for(f"{len(wanted)} messages in the main log", arrived, timeout_s)


@dataclass
class IngestWorld:
    """One project on the shared broker, with helpers to produce and to run the job."""

    spark: SparkSession
    bootstrap: str
    redis_url: str
    checkpoints: Path
    project: str = field(default_factory=lambda: f"ing-{uuid.uuid4().hex[:10]}")
    # Set: the project's records go through a shared ingest log of this many partitions, of
    # its own (``setu.ingest-{project}``), as with SETU_INGEST_LOG=shared (decision 0010).
    shared_partitions: int | None = None

    def __post_init__(self) -> None:
        self.admin = AdminClient({"bootstrap.servers": self.bootstrap})
        self.producer = Producer(
            {
                "bootstrap.servers": self.bootstrap,
                "partitioner": "murmur2_random",
                "enable.idempotence": True,
                "linger.ms": 5,
                # Like the API's producer: whatever the API accepts (setu.limits)
                "message.max.bytes": MessageLimits(DEFAULT_MAX_MESSAGE_BYTES).request_bytes,
            }
        )
        self.redis = redis.Redis.from_url(self.redis_url)
        self.topics: list[str] = []
        self.consumers: list[Consumer] = []
        self.metrics = IngestMetrics()
        self.shared_log: str | None = None
        if self.shared_partitions is not None:
            self.shared_log = f"{names.SHARED_INGEST_LOG}-{self.project}"
            log = NewTopic(self.shared_log, self.shared_partitions, 1)
            self.admin.create_topics([log])[self.shared_log].result(timeout=30)
            self.topics.append(self.shared_log)

    def settings(self, **overrides: object) -> Settings:
        values: dict[str, object] = {
            "kafka_bootstrap": self.bootstrap,
            "redis_url": self.redis_url,
            "spark_checkpoint_dir": str(self.checkpoints / self.project),
            "spark_trigger_ms": 200,
            "spark_shuffle_partitions": 2,
            "spark_realtime_batch_s": 30,  # as in the job's process (above)
        }
        if self.shared_log is not None:
            values.update(
                ingest_log="shared",
                ingest_log_topic=self.shared_log,
                ingest_log_partitions=self.shared_partitions,
            )
        values.update(overrides)
        return Settings(**values)  # type: ignore[arg-type]

    def create_topic(
        self, topic: str, partitions: int = 3, config: dict[str, str] | None = None
    ) -> None:
        """The ingest topic and its main log, as the API creates them (with the shared log: the
        main log and the ingest reject topic)."""
        created = [names.main_topic(self.project, topic), names.ingest_topic(self.project, topic)]
        if self.shared_log is not None:
            created[1] = names.ingest_rejects_topic(self.project, topic)
        futures = self.admin.create_topics(
            [NewTopic(t, partitions, 1, config=config or {}) for t in created]
        )
        for future in futures.values():
            future.result(timeout=30)
        self.topics.extend(created)

    def send(
        self,
        topic: str,
        message_id: str,
        group_id: str | None = None,
        producer_id: str | None = None,
        sequence_id: int | None = None,
        timestamp_ms: int = 0,
        body: bytes | None = None,
        incarnation: int = 0,
        dedup_window_ms: int = 0,
    ) -> None:
        """Produce like the API does; ``timestamp_ms`` (0 = now) is the record's CreateTime,
        ``incarnation`` the topic's creation time and ``dedup_window_ms`` its message id
        window, as the API stamps them."""
        envelope = Envelope(
            message_id=message_id,
            body=f"body of {message_id}".encode() if body is None else body,
            group_id=group_id,
            producer_id=producer_id,
            sequence_id=sequence_id,
            headers=(("X_TRACE", message_id),),
            topic_incarnation=incarnation,
            dedup_window_ms=dedup_window_ms,
        )
        headers = envelope.kafka_headers()
        target = names.ingest_topic(self.project, topic)
        if self.shared_log is not None:
            headers.append((H_TOPIC, names.main_topic(self.project, topic).encode()))
            target = self.shared_log
        self.producer.produce(
            target, envelope.body, key=envelope.key, headers=headers, timestamp=timestamp_ms
        )
        self.producer.poll(0)

    def flush(self) -> None:
        assert self.producer.flush(30) == 0

    def main_size(self, topic: str) -> int:
        """How many records the topic's main log holds now (its partitions' high marks)."""
        main = names.main_topic(self.project, topic)
        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": "sizes"})
        try:
            partitions = partitions_of(consumer, main)
            return sum(
                consumer.get_watermark_offsets(TopicPartition(main, p), timeout=10)[1]
                for p in partitions
            )
        finally:
            consumer.close()

    def main_log(self, topic: str) -> MainLog:
        return self.log_of(names.main_topic(self.project, topic))

    def log_of(self, main: str) -> MainLog:
        """A reader of any Kafka topic of this project, from its start."""
        consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": f"reader-{uuid.uuid4().hex}",
                "enable.auto.commit": False,
            }
        )
        partitions = partitions_of(consumer, main)
        consumer.assign([TopicPartition(main, p, 0) for p in partitions])
        self.consumers.append(consumer)
        return MainLog(consumer)

    def mark(self, topic: str, producer_id: str) -> int | None:
        """The producer's highest accepted sequence in Redis, whatever its incarnation."""
        found = self.marked(topic, producer_id)
        return None if found is None else found[1]

    def marked(self, topic: str, producer_id: str) -> tuple[int, int] | None:
        """The producer's mark in Redis as (topic incarnation, sequence)."""
        raw = self.redis.hget(keys.producer_marks(self.project, topic), producer_id)
        return None if raw is None else parse_mark(raw)

    def delete_topic(self, topic: str, partitions: int = 3) -> None:
        """As the API deletes a topic: its ingest topic retired, then its other Kafka topics
        deleted and the ingest topic emptied (state.retired_topics)."""
        ingest = names.ingest_topic(self.project, topic)
        self.redis.sadd(keys.retired_ingest_topics(), ingest)
        KafkaTopics(self.bootstrap).delete_topic(Topic(self.project, topic, partitions=partitions))

    def create_again(self, topic: str) -> None:
        """As the API creates a deleted topic again: its main topic made, its kept ingest
        topic emptied and no longer retired."""
        main = names.main_topic(self.project, topic)
        ingest = names.ingest_topic(self.project, topic)
        partitions = len(partitions_of(self.admin, ingest))
        for future in self.admin.create_topics([NewTopic(main, partitions, 1)]).values():
            future.result(timeout=30)
        KafkaTopics(self.bootstrap).empty(ingest)
        self.redis.srem(keys.retired_ingest_topics(), ingest)

    def ingest_pattern(self) -> str:
        """What this project's job reads: its topics' own ingest topics, and its shared log."""
        return names.with_shared_log(job.project_pattern(self.project), self.shared_log)

    def shared_env(self) -> dict[str, str]:
        """The settings of a ``setu ingest`` process on this world's shared log."""
        if self.shared_log is None:
            return {}
        return {
            "SETU_INGEST_LOG": "shared",
            "SETU_INGEST_LOG_TOPIC": self.shared_log,
            "SETU_INGEST_LOG_PARTITIONS": str(self.shared_partitions),
        }

    @contextmanager
    def running_job(self, settings: Settings) -> Iterator[None]:
        """``setu ingest``'s query and its helpers (:func:`spark.job.serve`) on the shared
        session, reading this project's ingest topics only, until the block ends."""
        settings = settings.model_copy(update={"spark_ingest_pattern": self.ingest_pattern()})
        with job.serving(self.spark, settings, self.redis, self.metrics):
            yield

    def close(self) -> None:
        for consumer in self.consumers:
            consumer.close()
        # Every topic of the project, also those the job's guard created (reject topics)
        listed = self.admin.list_topics(timeout=10).topics
        mine = [t for t in listed if t.startswith(f"setu.{self.project}.")]
        doomed = sorted(set(self.topics) | set(mine))
        if doomed:  # a test may end before it made any
            self.admin.delete_topics(doomed)
        for name in self.redis.scan_iter(f"{keys.PREFIX}:producers:{{{self.project}.*"):
            self.redis.delete(name)
        for retired in self.redis.smembers(keys.retired_ingest_topics()):
            if retired.decode().startswith(f"setu.{self.project}."):
                self.redis.srem(keys.retired_ingest_topics(), retired)
        self.redis.close()


def earlier_checkpoint(
    checkpoint: str,
    ingest: str,
    ends: Mapping[int, int],
    marks: Mapping[str, Mapping[int, int]],
    seen_ms: int,
) -> None:
    """Writes the checkpoint the Python micro-batch job of earlier versions left at
    ``checkpoint`` (:mod:`spark.dedup_state`, :mod:`spark.migration`): its batch 0 committed,
    having read ``ingest``'s partitions up to ``ends`` (partition -> next offset) and accepted
    ``marks`` (producer -> partition -> highest sequence) at ``seen_ms``."""
    by_partition: dict[int, dict[tuple[str, str], ProducerMark]] = {}
    for producer, partitions in marks.items():
        for partition, sequence in partitions.items():
            mark = ProducerMark({partition: sequence}, seen_ms, 0)
            by_partition.setdefault(partition, {})[(ingest, producer)] = mark
    for partition, held in by_partition.items():
        PartitionMarks(checkpoint).save(ingest, partition, 0, encode_marks(held))
    root = Path(checkpoint)
    (root / "offsets").mkdir(parents=True)
    (root / "commits").mkdir()
    offsets = json.dumps({ingest: {str(p): end for p, end in ends.items()}})
    (root / "offsets" / "0").write_text(f"v1\n{{}}\n{offsets}")
    (root / "commits" / "0").write_text("v1\n{}")
