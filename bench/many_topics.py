"""Many topics: the ingest job reading a project of ``--topics`` topics in real-time mode.

    python -m bench.many_topics [--bootstrap 127.0.0.1:9092] [--redis redis://127.0.0.1:6379/0]
                                [--topics 200] [--partitions 6] [--idle 30] [--seconds 60]
                                [--hot-rate 500] [--quiet-rate 2] [--env SETU_INGEST_LOG=shared]

Real-time mode holds a task, and a Kafka consumer, for every ingest partition it reads, all the
time (docs/ingest.md, "Modes, slots and the batch length"). This measures what that costs on
this machine, with Setu's own processes (``setu api``, ``setu ingest``, ``setu deliver``, as in
``bench.latency``) on one broker:

1. ``--topics`` topics of ``--partitions`` partitions are created through the API, one after
   the other; then a message is produced to each, and the time until the last one is in its
   main log is reported (the job picks new topics up by starting its query again).
2. Idle for ``--idle`` seconds: the cores each process and the broker (``--broker-pid``, if
   given) kept busy, and the ingest job's threads and resident memory.
3. For ``--seconds``, the first topic gets ``--hot-rate`` messages a second and the last one
   ``--quiet-rate``, written straight to their ingest topics: the time from each message's
   ingest record to its main-log record (both stamped by the broker), per topic, and the cores.

With ``--env SETU_INGEST_LOG=shared`` the topics' records go through the run's own shared ingest
log (decision 0010) instead of an ingest topic each, and are written there.

Figures are printed and written as JSON under bench/results/.
"""

from __future__ import annotations

import argparse
import json
import time
import uuid
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition

from bench.latency import (
    Stack,
    api_client,
    create,
    record_times,
    stack_arguments,
    stack_running,
    stats_ms,
    tree_cpu_s,
)
from bench.machine import (
    footprint,
    quiet_client_logs,
    quiet_kafka_config,
    service_arguments,
    write_result,
)
from setu import names
from setu.envelope import H_MESSAGE_ID, H_TOPIC, Envelope


def topic_name(index: int) -> str:
    return f"t{index:04d}"


def produce(
    producer: Producer, project: str, topic: str, message_id: str, shared: str | None
) -> None:
    """Writes a message to ``topic``'s ingest topic, or to the ``shared`` ingest log, as the
    API does."""
    envelope = Envelope(message_id=message_id, body=b"x" * 200, group_id=message_id[-3:])
    headers: list[tuple[str, str | bytes | None]] = list(envelope.kafka_headers())
    target = names.ingest_topic(project, topic)
    if shared is not None:
        headers.append((H_TOPIC, names.main_topic(project, topic).encode()))
        target = shared
    producer.produce(target, envelope.body, key=envelope.key, headers=headers)


def wait_in_main(bootstrap: str, project: str, wanted: dict[str, str], timeout_s: float) -> None:
    """Waits until every message id of ``wanted`` (id -> topic) is in its topic's main log."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"many-topics-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            **quiet_kafka_config(),
        }
    )
    mains = sorted({names.main_topic(project, t) for t in wanted.values()})
    listed = consumer.list_topics(timeout=30).topics
    consumer.assign(
        [TopicPartition(m, p, 0) for m in mains for p in listed[m].partitions if m in listed]
    )
    left = set(wanted)
    deadline = time.monotonic() + timeout_s
    try:
        while left:
            if time.monotonic() > deadline:
                raise SystemExit(f"{len(left)} messages not in their main logs after {timeout_s} s")
            for message in consumer.consume(1000, timeout=1):
                if message.error() is None:
                    headers = dict(message.headers() or [])
                    raw = headers.get(H_MESSAGE_ID) or b""
                    left.discard(raw.decode() if isinstance(raw, bytes) else raw)
    finally:
        consumer.close()


def cores(
    stack: Stack, broker_pid: int | None, seconds: float, before: dict[str, float]
) -> dict[str, float]:
    now = cpu_seconds(stack, broker_pid)
    return {name: round((now[name] - before[name]) / seconds, 3) for name in now}


def cpu_seconds(stack: Stack, broker_pid: int | None) -> dict[str, float]:
    out = {name: tree_cpu_s(p.pid) for name, p in stack.processes.items()}
    if broker_pid is not None:
        out["kafka"] = tree_cpu_s(broker_pid)
    return out


def ingest_footprint(stack: Stack) -> dict[str, int]:
    """The ingest job's threads and resident memory (MiB), its JVM included."""
    return footprint(stack.processes["ingest"].pid)


def load(
    bootstrap: str,
    project: str,
    hot: str,
    quiet: str,
    hot_rate: int,
    quiet_rate: int,
    seconds: float,
    shared: str | None,
) -> dict[str, list[str]]:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 1, "acks": "all"})
    sent: dict[str, list[str]] = {hot: [], quiet: []}
    started = time.monotonic()
    hot_every, quiet_every = 1 / hot_rate, 1 / quiet_rate
    next_hot, next_quiet = started, started
    while (now := time.monotonic()) < started + seconds:
        if now >= next_hot:
            message_id = f"h{len(sent[hot])}"
            produce(producer, project, hot, message_id, shared)
            sent[hot].append(message_id)
            next_hot += hot_every
        if now >= next_quiet:
            message_id = f"q{len(sent[quiet])}"
            produce(producer, project, quiet, message_id, shared)
            sent[quiet].append(message_id)
            next_quiet += quiet_every
        producer.poll(0)
        time.sleep(max(0.0, min(next_hot, next_quiet) - time.monotonic()))
    producer.flush(30)
    return sent


def ingest_latency(
    bootstrap: str, project: str, topic: str, ids: list[str], shared: str | None
) -> dict[str, Any]:
    ingest = record_times(bootstrap, shared or names.ingest_topic(project, topic))
    main = record_times(bootstrap, names.main_topic(project, topic))
    delays = [main[m] - ingest[m] for m in ids if m in main and m in ingest]
    return {"sent": len(ids), "in_main_log": len(delays), **stats_ms(delays)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    service_arguments(parser)
    stack_arguments(parser)
    parser.add_argument("--topics", type=int, default=200)
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--idle", type=float, default=30.0)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--hot-rate", type=int, default=500)
    parser.add_argument("--quiet-rate", type=int, default=2)
    parser.add_argument("--broker-pid", type=int, help="the broker's pid, to count its cores too")
    args = parser.parse_args()
    quiet_client_logs()
    project = f"many{uuid.uuid4().hex[:8]}"
    topics = [topic_name(i) for i in range(args.topics)]
    with stack_running(args, project, prefix="setu-many-topics-") as stack:
        started = time.monotonic()
        with api_client(stack) as client:
            create(client, "/v1/projects", {"name": project})
            for topic in topics:
                body = {"name": topic, "partitions": args.partitions}
                create(client, f"/v1/projects/{project}/topics", body)
        created_s = time.monotonic() - started
        print(f"{args.topics} topics created in {created_s:.1f} s", flush=True)
        producer = Producer({"bootstrap.servers": args.bootstrap, "acks": "all"})
        for topic in topics:
            produce(producer, project, topic, f"first-{topic}", stack.shared_log())
        producer.flush(30)
        wait_in_main(args.bootstrap, project, {f"first-{t}": t for t in topics}, 900)
        all_read_s = time.monotonic() - started
        print(f"a message of every topic in its main log {all_read_s:.1f} s after the first")
        stack.check_alive()

        before = cpu_seconds(stack, args.broker_pid)
        time.sleep(args.idle)
        idle = cores(stack, args.broker_pid, args.idle, before)
        footprint = ingest_footprint(stack)
        print(f"idle: cores {idle}, ingest {footprint}", flush=True)

        hot, quiet = topics[0], topics[-1]
        before = cpu_seconds(stack, args.broker_pid)
        sent = load(
            args.bootstrap,
            project,
            hot,
            quiet,
            args.hot_rate,
            args.quiet_rate,
            args.seconds,
            stack.shared_log(),
        )
        busy = cores(stack, args.broker_pid, args.seconds, before)
        time.sleep(5)  # the last records' way through
        stack.check_alive()
        latency = {
            "hot": ingest_latency(args.bootstrap, project, hot, sent[hot], stack.shared_log()),
            "quiet": ingest_latency(
                args.bootstrap, project, quiet, sent[quiet], stack.shared_log()
            ),
        }
        print(f"under load: cores {busy}\n{json.dumps(latency, indent=2)}")
        result = {
            "benchmark": "many_topics",
            "settings": {
                "topics": args.topics,
                "partitions": args.partitions,
                "hot_rate": args.hot_rate,
                "quiet_rate": args.quiet_rate,
                "env": args.env,
            },
            "topics_created_s": round(created_s, 1),
            "every_topic_read_s": round(all_read_s, 1),
            "idle": {"cores": idle, **footprint},
            "load": {"cores": busy, "ingest_latency_ms": latency, **ingest_footprint(stack)},
        }
        out = write_result("many-topics", result, f"-{args.label}" if args.label else "")
        print(f"written to {out}")


if __name__ == "__main__":
    main()
