"""How long delivery stalls when Redis forgets everything (decision 0007, docs/decisions/).

    python -m bench.redis_forgets [--bootstrap ...] [--redis ...] [--rate 50] [--groups 20]

One grouped subscription (two partitions, retry tiers of 300 and 600 ms) and a ``setu deliver``
worker (``bench.delivery``'s worker mode); group P is parked behind a 400. Then a steady
producer writes ``--rate`` messages a second over ``--groups`` groups to the main log, and
after ``--before`` seconds Redis gets a ``FLUSHALL``. Reported, as measured in the same run:

- each message's wait from being written to its first 2xx, for messages written before the
  flush (the baseline) and after it (p50, p99, max);
- the longest gap between two 2xx calls after the flush, against the longest before it;
- when, after the flush, P's state was back in Redis (parked, 3 messages) and the subscription's
  partitions were marked loaded again;
- whether every message was delivered, each group's first deliveries in published order, and
  P's later messages never called.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
import uuid
from itertools import pairwise
from typing import Any

import redis
from confluent_kafka import Producer

from bench.machine import write_result
from bench.stall import PARTITIONS, serve_subscription, summary, wait
from setu.envelope import Envelope
from setu.producer_settings import durable_producer
from state import keys


def publish(producer: Producer, main: str, group: str) -> str:
    message_id = f"{group}-{uuid.uuid4().hex[:10]}"
    envelope = Envelope(message_id, message_id.encode(), group_id=group)
    producer.produce(
        main,
        value=envelope.body,
        key=envelope.key,
        headers=list[tuple[str, str | bytes | None]](envelope.kafka_headers()),
    )
    return message_id


def run(args: argparse.Namespace) -> dict[str, Any]:
    served = serve_subscription("forget", args.bootstrap, args.redis)
    project, calls = served.project, served.calls
    client = redis.Redis.from_url(args.redis)
    producer = Producer({**durable_producer(args.bootstrap), "linger.ms": 0})
    main = served.main
    try:
        parked = [publish(producer, main, "P") for _ in range(3)]
        producer.flush(10)
        state_key = keys.group_state(project, "s", "P")

        def p_parked() -> bool:
            counts = client.hget(state_key, "counts")
            return counts is not None and counts.decode().split(",")[-1] == "3"

        wait("P parked", p_parked, 120)
        written: dict[str, float] = {}
        order: dict[str, list[str]] = {f"G{n}": [] for n in range(args.groups)}
        stop = threading.Event()

        def produce() -> None:
            interval, n = 1 / args.rate, 0
            start = time.monotonic()
            while not stop.is_set():
                group = f"G{n % args.groups}"
                message_id = publish(producer, main, group)
                producer.poll(0)
                written[message_id] = time.monotonic()
                order[group].append(message_id)
                n += 1
                time.sleep(max(0.0, start + n * interval - time.monotonic()))
            producer.flush(10)

        thread = threading.Thread(target=produce, daemon=True)
        thread.start()
        time.sleep(args.before)
        flushed_at = time.monotonic()
        client.flushall()
        loaded = keys.state_loaded(project, "s")
        back_at = wait("P parked again", p_parked, 120)
        loaded_at = wait("partitions loaded", lambda: client.hlen(loaded) == PARTITIONS, 120)
        time.sleep(args.after)
        stop.set()
        thread.join(30)
        wait(
            "everything delivered",
            lambda: set(written) <= set(calls.first_2xx()),
            args.drain_timeout,
        )
    finally:
        served.stop()
    first = calls.first_2xx()
    before = [first[m] - t for m, t in written.items() if t < flushed_at]
    after = [first[m] - t for m, t in written.items() if t >= flushed_at]
    times = sorted(first.values())
    gaps_after = [b - a for a, b in pairwise(times) if a >= flushed_at - 1]
    gaps_before = [b - a for a, b in pairwise(times) if b < flushed_at]
    in_order = all(
        [m for m in sorted(first, key=first.__getitem__) if m in set(ids)] == ids
        for ids in order.values()
    )
    p_calls = [m for _, g, m, _ in calls.rows if g == "P"]

    return {
        "benchmark": "redis_forgets",
        "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "rate_per_s": args.rate,
        "groups": args.groups,
        "wait_before_flush": summary(before),
        "wait_after_flush": summary(after),
        "longest_gap_before_ms": round(max(gaps_before, default=0.0) * 1000, 1),
        "longest_gap_after_ms": round(max(gaps_after, default=0.0) * 1000, 1),
        "parked_group_back_after_ms": round((back_at - flushed_at) * 1000),
        "partitions_loaded_after_ms": round((loaded_at - flushed_at) * 1000),
        "all_delivered_in_order": in_order,
        "parked_followers_called": [m for m in p_calls if m != parked[0]],
        "load_average_1m": round(os.getloadavg()[0], 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--bootstrap", default=os.environ.get("SETU_KAFKA_BOOTSTRAP", "127.0.0.1:9092")
    )
    parser.add_argument(
        "--redis", default=os.environ.get("SETU_REDIS_URL", "redis://127.0.0.1:6379/0")
    )
    parser.add_argument("--rate", type=float, default=50.0)
    parser.add_argument("--groups", type=int, default=20)
    parser.add_argument("--before", type=float, default=15.0, help="seconds before the flush")
    parser.add_argument("--after", type=float, default=20.0, help="seconds after the rebuild")
    parser.add_argument("--drain-timeout", type=float, default=120.0)
    document = run(parser.parse_args(argv))
    print(json.dumps(document, indent=2))
    print(f"written to {write_result('redis_forgets', document)}")
    ok = document["all_delivered_in_order"] and not document["parked_followers_called"]
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
