"""How long delivery stalls when a Kafka node dies and comes back with an empty disk
(docs/design.md §7).

    python -m bench.broker_wipe [--redis ...] [--rate 50] [--groups 20]

The bench starts its own three-node KRaft cluster (``cli/kafka_cluster.py``; every topic with
three replicas, two in sync for a write) and a ``setu deliver`` worker (``bench.delivery``'s
worker mode) for one grouped subscription whose group P is parked behind a 400. A steady
producer (acks=all) writes ``--rate`` messages a second over ``--groups`` groups to the main
log; after ``--before`` seconds the node leading the main log's partition 0 is SIGKILLed, its
data folder replaced by an empty one, and it is started again and made a voter of the quorum
again. Reported, as measured in the same run:

- each acknowledged message's wait from being written to its first 2xx, before the kill and
  after it (p50, p99, max), and how many writes the cluster refused meanwhile;
- the longest gap between two 2xx calls after the kill, against the longest before it, and
  the first 2xx after the kill;
- how long the node took to come back and rejoin;
- whether every acknowledged message was delivered, each group's first deliveries in
  published order, and P's later messages never called.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import tempfile
import threading
import time
import uuid
from itertools import pairwise
from pathlib import Path
from typing import Any

import redis
from confluent_kafka import KafkaError, Message, Producer
from confluent_kafka.admin import AdminClient

from bench.machine import write_result
from bench.stall import serve_subscription, summary, wait
from cli.jars import resolve_kafka_jars
from cli.kafka_cluster import LocalKafkaCluster
from setu.envelope import Envelope
from setu.producer_settings import durable_producer
from setu.settings import Settings
from state import keys

REPLICAS = 3


def leader_of(bootstrap: str, topic: str, partition: int) -> int:
    found = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=10)
    return int(found.topics[topic].partitions[partition].leader)


def run(args: argparse.Namespace) -> dict[str, Any]:
    home = Path(tempfile.mkdtemp(prefix="setu-broker-wipe-"))
    libs = resolve_kafka_jars(Settings())[0].parent
    cluster = LocalKafkaCluster.on_free_ports(home / "kafka", libs, size=REPLICAS)
    cluster.start(180)
    try:
        return measure(args, cluster)
    finally:
        cluster.stop()


def measure(args: argparse.Namespace, cluster: LocalKafkaCluster) -> dict[str, Any]:
    bootstrap = cluster.bootstrap
    served = serve_subscription("wipe", bootstrap, args.redis, replication_factor=REPLICAS)
    project, calls = served.project, served.calls
    client = redis.Redis.from_url(args.redis)
    producer = Producer(
        {**durable_producer(bootstrap), "linger.ms": 0, "message.timeout.ms": 30_000}
    )
    main = served.main
    written: dict[str, float] = {}  # acknowledged: message id -> when it was handed over
    refused: list[str] = []
    order: dict[str, list[str]] = {f"G{n}": [] for n in range(args.groups)}

    def send(group: str) -> str:
        message_id = f"{group}-{uuid.uuid4().hex[:10]}"
        envelope = Envelope(message_id, message_id.encode(), group_id=group)
        handed = time.monotonic()

        def acknowledged(error: KafkaError | None, message: Message) -> None:
            if error is None:
                written[message_id] = handed
            else:
                refused.append(str(error))

        producer.produce(
            main,
            value=envelope.body,
            key=envelope.key,
            headers=list[tuple[str, str | bytes | None]](envelope.kafka_headers()),
            on_delivery=acknowledged,
        )
        return message_id

    try:
        parked = [send("P") for _ in range(3)]
        producer.flush(30)
        state_key = keys.group_state(project, "s", "P")

        def p_parked() -> bool:
            counts = client.hget(state_key, "counts")
            return counts is not None and counts.decode().split(",")[-1] == "3"

        wait("P parked", p_parked, 180)
        stop = threading.Event()

        def produce() -> None:
            interval, n = 1 / args.rate, 0
            start = time.monotonic()
            while not stop.is_set():
                group = f"G{n % args.groups}"
                order[group].append(send(group))
                producer.poll(0)
                n += 1
                time.sleep(max(0.0, start + n * interval - time.monotonic()))
            producer.flush(60)

        thread = threading.Thread(target=produce, daemon=True)
        thread.start()
        time.sleep(args.before)
        victim = leader_of(bootstrap, main, 0)
        killed_at = time.monotonic()
        cluster.kill_node(victim)
        cluster.replace_disk(victim)
        cluster.start_node(victim)
        cluster.join_quorum(victim, 300.0)
        rejoined_at = time.monotonic()
        time.sleep(args.after)
        stop.set()
        thread.join(90)
        with contextlib.suppress(TimeoutError):  # reported: undelivered
            wait(
                "everything acknowledged delivered",
                lambda: set(written) - set(parked) <= set(calls.first_2xx()),
                args.drain_timeout,
            )
        p_still_parked = p_parked()
    finally:
        served.stop()
    first = calls.first_2xx()
    reached = {m: t for m, t in written.items() if m in first}
    before = [first[m] - t for m, t in reached.items() if t < killed_at]
    after = [first[m] - t for m, t in reached.items() if t >= killed_at]
    times = sorted(first.values())
    gaps_after = [b - a for a, b in pairwise(times) if a >= killed_at - 1]
    gaps_before = [b - a for a, b in pairwise(times) if b < killed_at]
    first_after = min((t for t in times if t > killed_at), default=killed_at)
    by_time = sorted(first, key=first.__getitem__)

    def delivered_in_order(ids: list[str]) -> bool:
        acked = [m for m in ids if m in written]
        wanted = set(acked)
        return [m for m in by_time if m in wanted] == acked

    in_order = all(delivered_in_order(ids) for ids in order.values())
    p_calls = [m for _, g, m, _ in calls.rows if g == "P"]

    return {
        "benchmark": "broker_wipe",
        "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "rate_per_s": args.rate,
        "groups": args.groups,
        "wiped_node": victim,
        "wait_before_kill": summary(before),
        "wait_after_kill": summary(after),
        "writes_refused": len(refused),
        "refusals": sorted(set(refused))[:5],
        "longest_gap_before_ms": round(max(gaps_before, default=0.0) * 1000, 1),
        "longest_gap_after_ms": round(max(gaps_after, default=0.0) * 1000, 1),
        "first_2xx_after_kill_ms": round((first_after - killed_at) * 1000),
        "node_back_and_voter_after_ms": round((rejoined_at - killed_at) * 1000),
        "undelivered": len(set(written) - set(first) - set(parked)),
        "all_delivered_in_order": in_order and not set(written) - set(first) - set(parked),
        "parked_group_still_parked": p_still_parked,
        "parked_followers_called": [m for m in p_calls if m != parked[0]],
        "load_average_1m": round(os.getloadavg()[0], 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--redis", default=os.environ.get("SETU_REDIS_URL", "redis://127.0.0.1:6379/0")
    )
    parser.add_argument("--rate", type=float, default=50.0)
    parser.add_argument("--groups", type=int, default=20)
    parser.add_argument("--before", type=float, default=20.0, help="seconds before the kill")
    parser.add_argument("--after", type=float, default=20.0, help="seconds after the rejoin")
    parser.add_argument("--drain-timeout", type=float, default=180.0)
    document = run(parser.parse_args(argv))
    print(json.dumps(document, indent=2))
    print(f"written to {write_result('broker_wipe', document)}")
    ok = (
        document["all_delivered_in_order"]
        and document["parked_group_still_parked"]
        and not document["parked_followers_called"]
    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
