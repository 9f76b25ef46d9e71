"""Fan-out: many subscriptions of one topic, served by a couple of delivery workers.

    python -m bench.fanout [--bootstrap 127.0.0.1:9092] [--redis redis://127.0.0.1:6379/0]
                           [--subscriptions 1000] [--workers 2] [--partitions 6]
                           [--rate 100] [--seconds 60] [--settle 45] [--idle 30]
                           [--reach-timeout 300]
                           [--kafka-nodes 3]

Setu's own processes as deployed (``setu api``, ``setu ingest`` and ``--workers`` of
``setu deliver``, as in ``bench.latency``) on one broker, or on a cluster of its own with
``--kafka-nodes`` (needed from a few hundred subscriptions: each adds 30 partitions once its
endpoint has failed, its retry tiers and DLQ, and one broker here may keep 20,000 files
open); one webhook process answers 200 at once on a path per
subscription (``/hook/<n>``) and timestamps every call.

1. **Creating.** One grouped topic of ``--partitions`` partitions; once a first message of it
   reached its main log (the ingest job's start on a fresh stack is not fan-out), then
   ``--subscriptions`` grouped subscriptions of it, one after the other, each with its own
   endpoint: how long each ``POST .../subscriptions`` took.
2. **One message to all.** One message on each partition (a group each) is produced right
   after the last create was answered; how long each took to reach each endpoint (from its
   produce), and how many endpoints got all of them within ``--reach-timeout`` (then every
   worker runs its share of every subscription, and the idle and load phases below measure
   subscriptions already running). A create is answered before the subscription's Kafka
   topics exist and before any worker runs it (docs/delivery.md, "A new subscription"), so
   this figure includes the workers' takeover of all of them (a subscription adds no Kafka
   topic until its first failure: its group state is in its topic's changelog, decision 0014).
3. **Idle.** After ``--settle`` seconds of quiet (their cores are reported too, as
   ``idle_settling``: a runner gives its share of ``max_in_flight`` back after 30 s idle,
   docs/delivery.md), for ``--idle`` seconds: each worker's cores, threads and resident
   memory. A subscription idle for minutes is the common case the target speaks of.
   Then **one message to all, running**: as in 2, with every subscription running (the
   fan-out itself, without the making and taking over of a thousand new subscriptions).
4. **Load.** ``--rate`` messages a second for ``--seconds`` (open loop, as ``bench.latency``)
   over 1,000 groups: the webhook calls a second reached, the workers' cores per call, and
   the time from each message's scheduled produce to each endpoint's call.
5. **Beside failing subscriptions** (``--failing K``). K more subscriptions of the topic whose
   endpoints fail (half answer 503, half never answer); once each has been called (it runs),
   the load again: the healthy subscriptions' produce-to-call times against the load before
   (one slow or failing subscription must not slow the others of its topic).
6. **New subscriptions.** ``--new`` more are created one after the other, the workers
   otherwise quiet, nothing produced: how long after its creation each endpoint is first
   called (a new subscription reads its topic from the first retained record, which the
   phases before produced).

Targets (issue "Fan-out that scales"; this 2-core machine): 1,000 subscriptions, two workers;
one message reaches every endpoint with p99 <= 10 s (held to both measures, right after the
creates and once running); worker threads <= 100 and idle cores
<= 0.1 each; creating a subscription <= 200 ms; its first delivery within 5 s.
Figures are printed and written as JSON under bench/results/.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
from confluent_kafka import Consumer, KafkaException, TopicPartition

from bench.latency import (
    Phase,
    Stack,
    api_client,
    create,
    run_load,
    stack_arguments,
    stack_running,
    stats_ms,
    tree_cpu_s,
    webhook_get,
)
from bench.machine import footprint, quiet_client_logs, service_arguments, write_result
from setu import names
from setu.partitioner import partition_for

TOPIC = "events"
# How long the load's calls are waited for once it ended.
DRAIN_S = 120.0
GROUPS = 1_000
TARGETS = {
    "reach_all_p99_s": 10.0,
    "reach_all_running_p99_s": 10.0,
    "worker_threads": 100,
    "worker_idle_cores": 0.1,
    "create_ms": 200.0,
    "first_delivery_s": 5.0,
}


def endpoint(stack: Stack, n: int) -> str:
    return f"http://127.0.0.1:{stack.webhook_port}/hook/{n}"


def subscribe(client: httpx.Client, stack: Stack, n: int, url: str | None = None) -> float:
    """Creates subscription ``n`` of the topic (its own endpoint, or ``url``); seconds its
    POST took."""
    began = time.monotonic()
    create(
        client,
        f"/v1/projects/{stack.project}/subscriptions",
        {
            "name": f"s{n:04d}",
            "topic": TOPIC,
            "grouped": True,
            "endpoint": {"url": url or endpoint(stack, n)},
        },
    )
    return time.monotonic() - began


def produce(client: httpx.Client, stack: Stack, message_id: str) -> float:
    """Produces one message; the wall clock when it was sent."""
    sent = time.time()
    response = client.post(
        f"/v1/projects/{stack.project}/topics/{TOPIC}/produce",
        content=b"{}",
        headers={"X_MESSAGE_ID": message_id, "X_GROUP_ID": message_id},
    )
    if response.status_code // 100 != 2:
        raise SystemExit(f"produce: {response.status_code} {response.text}")
    return sent


def arrivals(stack: Stack) -> dict[str, list[float]]:
    """``/hook/<n>#<message id>`` -> [first call's wall clock, calls]."""
    found: dict[str, list[float]] = orjson.loads(webhook_get(stack.webhook_port, "dump"))
    return found


def reached(stack: Stack, message_id: str, endpoints: range) -> dict[int, float]:
    """Endpoint -> when ``message_id`` first reached it."""
    calls = arrivals(stack)
    out = {}
    for n in endpoints:
        seen = calls.get(f"/hook/{n}#{message_id}")
        if seen is not None:
            out[n] = seen[0]
    return out


def reach_all(stack: Stack, count: int, partitions: int, timeout_s: float) -> dict[str, Any]:
    """One message on each partition of the topic to every endpoint (so every worker's share
    of every subscription is running once they all arrived): seconds from each produce to
    each endpoint's call, and how many endpoints got all of them."""
    ids = one_per_partition(partitions)
    with api_client(stack) as client:
        sent = {message_id: produce(client, stack, message_id) for message_id in ids}
    deadline = time.monotonic() + timeout_s
    got: dict[str, dict[int, float]] = {}
    while time.monotonic() < deadline:
        stack.check_alive()
        got = {message_id: reached(stack, message_id, range(count)) for message_id in ids}
        if all(len(at) == count for at in got.values()):
            break
        time.sleep(1.0)
    delays = [t - sent[message_id] for message_id, at in got.items() for t in at.values()]
    whole = sum(all(n in at for at in got.values()) for n in range(count))
    # Each endpoint's last arrival, by tenth of the subscriptions in the order they were
    # made: right after the creates, a tail in the last tenths is takeovers still under way.
    last = [
        max((at[n] - sent[m] for m, at in got.items() if n in at), default=timeout_s)
        for n in range(count)
    ]
    tenth = max(count // 10, 1)
    by_tenth = [seconds_stats(last[i : i + tenth])["p99"] for i in range(0, count, tenth)]
    # And by message (one per partition): a partition whose reader lagged shows here.
    by_message = [seconds_stats([t - sent[m] for t in got.get(m, {}).values()])["p99"] for m in ids]
    return {
        "endpoints": count,
        "messages": len(ids),
        "reached": whole,
        **seconds_stats(delays),
        "p99_by_creation_tenth": by_tenth,
        "p99_by_partition": by_message,
    }


def one_per_partition(partitions: int) -> list[str]:
    """Message ids (each its own group) whose groups land on each partition once."""
    run = uuid.uuid4().hex[:6]
    found: dict[int, str] = {}
    n = 0
    while len(found) < partitions:
        message_id = f"one-{run}-{n}"
        found.setdefault(partition_for(message_id.encode(), partitions), message_id)
        n += 1
    return [found[p] for p in range(partitions)]


def ingest_ready(client: httpx.Client, stack: Stack, timeout_s: float) -> float:
    """Produces one message and waits until it is in the topic's main log: seconds it took."""
    began = time.monotonic()
    produce(client, stack, f"warm-{uuid.uuid4().hex[:6]}")
    main = names.main_topic(stack.project, TOPIC)
    consumer = Consumer({"bootstrap.servers": stack.bootstrap, "group.id": "bench-fanout-ready"})
    try:
        while time.monotonic() - began < timeout_s:
            stack.check_alive()
            meta = consumer.list_topics(main, timeout=10).topics.get(main)
            if meta is not None and meta.error is None:
                try:
                    ends = [
                        consumer.get_watermark_offsets(TopicPartition(main, p), timeout=10)[1]
                        for p in meta.partitions
                    ]
                except KafkaException:  # a topic just made: its leaders are being elected
                    ends = []
                if sum(ends) > 0:
                    return round(time.monotonic() - began, 1)
            time.sleep(0.5)
    finally:
        consumer.close()
    raise SystemExit(f"ingest: nothing reached {main} within {timeout_s:.0f} s")


def seconds_stats(values_s: list[float]) -> dict[str, Any]:
    return {k: (round(v / 1000, 3) if k != "n" else v) for k, v in stats_ms(values_s).items()}


def workers(stack: Stack) -> dict[str, int]:
    return {name: pid for name, pid in stack.pids().items() if name.startswith("deliver")}


def worker_cpu(stack: Stack) -> dict[str, float]:
    return {name: tree_cpu_s(pid) for name, pid in workers(stack).items()}


def cores_since(stack: Stack, before: dict[str, float], seconds: float) -> dict[str, float]:
    now = worker_cpu(stack)
    return {name: round((now[name] - before[name]) / seconds, 3) for name in now}


SLOW_S = 2.0


def load(stack: Stack, count: int, rate: float, seconds: float) -> dict[str, Any]:
    """``rate`` msg/s for ``seconds``; then waits up to 120 s for every call."""
    phase = Phase(f"load{uuid.uuid4().hex[:4]}", rate, dedup=False)
    headers = {"p": stack.project, "t": TOPIC, "auth": f"Bearer {stack.admin_key}"}
    before = worker_cpu(stack)
    calls_before = int(webhook_get(stack.webhook_port, "count"))
    began = time.monotonic()
    sent, _ = asyncio.run(run_load(stack.api_port, phase, seconds, 0.0, headers))
    accepted = {k: s for k, s in sent.items() if s.status // 100 == 2}
    expected = len(accepted) * count
    # Beyond this machine at 1,000 endpoints (100,000 calls a second): what was called within
    # the wait is what is measured.
    deadline = time.monotonic() + DRAIN_S
    while int(webhook_get(stack.webhook_port, "count")) - calls_before < expected:
        if time.monotonic() > deadline:
            break
        stack.check_alive()
        time.sleep(1.0)
    elapsed = time.monotonic() - began
    everything = arrivals(stack)
    calls = {
        k: v for k, v in everything.items() if k.startswith("/hook/") and f"#{phase.name}-" in k
    }
    # Calls to the failing endpoints (--failing), each message's attempts counted
    failing = [
        int(v[1])
        for k, v in everything.items()
        if k.startswith(("/fail/", "/hang/")) and f"#{phase.name}-" in k
    ]
    cpu = cores_since(stack, before, elapsed)
    delays = []
    slow: dict[str, int] = {}  # endpoint -> calls later than SLOW_S
    last_slow_due = None
    start_due = min((s.due for s in accepted.values()), default=0.0)
    for key, (first, _) in calls.items():
        endpoint, message = key.split("#", 1)
        delay = first - accepted[message].due
        delays.append(delay)
        if delay > SLOW_S:
            slow[endpoint] = slow.get(endpoint, 0) + 1
            due = accepted[message].due - start_due
            last_slow_due = due if last_slow_due is None else max(last_slow_due, due)
    first_call = min((v[0] for v in calls.values()), default=0.0)
    last_call = max((v[0] for v in calls.values()), default=0.0)
    span = max(last_call - first_call, 1e-9)
    cpu_s = sum(cpu.values()) * elapsed
    return {
        "rate_per_s": rate,
        "seconds": seconds,
        "messages_accepted": len(accepted),
        "failed_posts": len(sent) - len(accepted),
        "calls_expected": expected,
        "calls_made": len(calls),
        "duplicate_calls": sum(int(v[1]) - 1 for v in calls.values()),
        "failing_endpoint_calls": sum(failing),
        "failing_endpoint_messages": len(failing),
        "calls_per_s": round(len(calls) / span, 1),
        "worker_cores": cpu,
        "worker_cpu_ms_per_call": round(cpu_s * 1000 / max(len(calls), 1), 3),
        # Where the calls later than SLOW_S were: how many, at how many endpoints (the five
        # with most), and the last one's produce time into the load (a warm-up ends early).
        "slow_calls": {
            "over_s": SLOW_S,
            "calls": sum(slow.values()),
            "endpoints": len(slow),
            "most": sorted(slow.items(), key=lambda kv: -kv[1])[:5],
            "last_due_s": None if last_slow_due is None else round(last_slow_due, 1),
        },
        "produce_to_call_s": seconds_stats(delays),
    }


def add_failing(stack: Stack, first: int, count: int) -> None:
    """Subscriptions ``first`` .. ``first + count - 1`` of the topic, whose endpoints fail:
    every other one answers 503 at once, the others never answer (the call times out)."""
    with api_client(stack) as client:
        for n in range(first, first + count):
            kind = "fail" if n % 2 == 0 else "hang"
            subscribe(client, stack, n, f"http://127.0.0.1:{stack.webhook_port}/{kind}/{n}")


def until_called(stack: Stack, subscriptions: range, timeout_s: float) -> float | None:
    """Seconds until the endpoint of every subscription in ``subscriptions`` was called once
    (each runs: a worker took it over); None when one was not within ``timeout_s``. The load
    beside failing subscriptions measures them running, not their creation: making their
    topics and taking them over while the load runs is a burst of its own on the broker."""
    began = time.monotonic()
    wanted = {n: (f"/fail/{n}#", f"/hang/{n}#") for n in subscriptions}
    while time.monotonic() - began < timeout_s:
        called = list(arrivals(stack))
        if all(any(k.startswith(paths) for k in called) for paths in wanted.values()):
            return round(time.monotonic() - began, 1)
        stack.check_alive()
        time.sleep(0.5)
    return None


def beside_failing(baseline: dict[str, Any], load: dict[str, Any]) -> dict[str, Any]:
    """The healthy subscriptions' produce-to-call times beside failing ones, against the same
    load before those were added (same run)."""
    before, after = baseline["produce_to_call_s"], load["produce_to_call_s"]
    return {
        key: {
            "before_s": before.get(key),
            "beside_failing_s": after.get(key),
            "ratio": (
                round(after[key] / before[key], 2) if before.get(key) and after.get(key) else None
            ),
        }
        for key in ("p50", "p95", "p99")
    } | {"calls_made": [baseline["calls_made"], load["calls_made"]]}


def first_delivery(stack: Stack, first: int, count: int, timeout_s: float) -> dict[str, Any]:
    """Seconds from each of ``count`` new subscriptions' creation to its endpoint's first
    call, created one after the other with the workers otherwise quiet. Nothing is produced
    meanwhile: a new subscription reads its topic's main log from its first retained record
    (docs/delivery.md, "A new subscription"), which the phases before filled, so its first
    call is of that history. (Producing meanwhile would load the workers with a call to every
    other endpoint for each message, and measure that instead.)"""
    created: list[float] = []
    delivered: list[float] = []
    missed = 0
    with api_client(stack) as client:
        for n in range(first, first + count):
            created_in = subscribe(client, stack, n)
            began = time.monotonic() - created_in
            created.append(created_in)
            while not any(k.startswith(f"/hook/{n}#") for k in arrivals(stack)):
                if time.monotonic() - began > timeout_s:
                    missed += 1
                    break
                stack.check_alive()
                time.sleep(0.05)
            else:
                delivered.append(time.monotonic() - began)
    return {
        "subscriptions": count,
        "create_ms": stats_ms(created),
        "first_delivery_s": seconds_stats(delivered),
        "missed": missed,
    }


def verdicts(figures: dict[str, Any]) -> dict[str, Any]:
    idle = figures["idle"]
    reach = figures["one_message"]
    running = figures["one_message_running"]
    checks: dict[str, Any] = {
        "reach_all_p99_s": (reach.get("p99") if reach["reached"] == reach["endpoints"] else None),
        "reach_all_running_p99_s": (
            running.get("p99") if running["reached"] == running["endpoints"] else None
        ),
        "worker_threads": max(w["threads"] for w in idle["footprint"].values()),
        "worker_idle_cores": max(idle["cores"].values()),
        "create_ms": figures["create_ms"].get("p99"),
        # The slowest of the new ones, when each was delivered to at all
        "first_delivery_s": (
            None
            if figures["new_subscription"]["missed"]
            else figures["new_subscription"]["first_delivery_s"].get("max")
        ),
    }
    return {
        name: {
            "value": value,
            "target": TARGETS[name],
            "met": value is not None and value <= TARGETS[name],
        }
        for name, value in checks.items()
    }


@contextlib.contextmanager
def own_kafka(args: argparse.Namespace) -> Iterator[str]:
    """The bootstrap to run on: ``--bootstrap``, or that of a cluster of ``--kafka-nodes``
    started here (stopped afterwards, and its folder removed unless ``--keep``)."""
    if args.kafka_nodes <= 0:
        yield args.bootstrap
        return
    from cli.jars import resolve_kafka_jars
    from cli.kafka_cluster import LocalKafkaCluster
    from setu.settings import Settings

    home = Path(tempfile.mkdtemp(prefix="setu-fanout-kafka-"))
    libs = resolve_kafka_jars(Settings())[0].parent
    cluster = LocalKafkaCluster.on_free_ports(home, libs, size=args.kafka_nodes, heap="1g")
    cluster.start(120.0)
    print(f"kafka: {args.kafka_nodes} nodes at {cluster.bootstrap} ({home})", flush=True)
    try:
        yield cluster.bootstrap
    finally:
        cluster.stop()
        if not args.keep:
            shutil.rmtree(home, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    service_arguments(parser)
    stack_arguments(parser)
    parser.add_argument("--subscriptions", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--idle", type=float, default=30.0)
    parser.add_argument("--settle", type=float, default=45.0)
    parser.add_argument("--reach-timeout", type=float, default=300.0)
    parser.add_argument(
        "--kafka-nodes",
        type=int,
        default=0,
        help="run on a Kafka cluster of this many nodes of its own (topics with one replica, "
        "spread over them) instead of --bootstrap: a broker keeps a file open for each of its "
        "partitions, and 1,000 subscriptions' topics are more than one broker here may open",
    )
    parser.add_argument(
        "--new",
        type=int,
        default=5,
        help="at the end, create this many more subscriptions one after the other, the workers "
        "otherwise quiet: each one's first delivery after its creation",
    )
    parser.add_argument(
        "--failing",
        type=int,
        default=0,
        help="after the load, add this many subscriptions whose endpoints fail (half answer "
        "503, half never answer) and run the load again: the healthy ones' times beside them",
    )
    args = parser.parse_args()
    quiet_client_logs()
    count = args.subscriptions
    project = f"fan{uuid.uuid4().hex[:8]}"
    figures: dict[str, Any] = {
        "settings": {
            k: getattr(args, k)
            for k in (
                "subscriptions",
                "workers",
                "partitions",
                "rate",
                "seconds",
                "settle",
                "idle",
                "failing",
                "env",
                "kafka_nodes",
            )
        }
    }
    with (
        own_kafka(args) as bootstrap,
        stack_running(
            argparse.Namespace(**{**vars(args), "bootstrap": bootstrap}),
            project,
            prefix="setu-fanout-",
            more_workers=args.workers - 1,
        ) as stack,
    ):
        with api_client(stack) as client:
            create(client, "/v1/projects", {"name": project})
            create(
                client,
                f"/v1/projects/{project}/topics",
                {"name": TOPIC, "grouped": True, "partitions": args.partitions},
            )
            figures["ingest_ready_s"] = ingest_ready(client, stack, timeout_s=300)
            print(f"ingest ready after {figures['ingest_ready_s']} s", flush=True)
            took = []
            began = time.monotonic()
            for n in range(count):
                took.append(subscribe(client, stack, n))
                if (n + 1) % 100 == 0:
                    print(f"{n + 1} subscriptions created", flush=True)
            figures["create_all_s"] = round(time.monotonic() - began, 1)
            figures["create_ms"] = stats_ms(took)
        print(f"creating {count}: {figures['create_ms']}", flush=True)
        figures["one_message"] = reach_all(stack, count, args.partitions, args.reach_timeout)
        print(f"one message to all: {figures['one_message']}", flush=True)
        if args.settle:
            before = worker_cpu(stack)
            time.sleep(args.settle)
            figures["idle_settling"] = {"cores": cores_since(stack, before, args.settle)}
            print(f"idle, settling: {figures['idle_settling']}", flush=True)
        before = worker_cpu(stack)
        time.sleep(args.idle)
        figures["idle"] = {
            "cores": cores_since(stack, before, args.idle),
            "footprint": {name: footprint(pid) for name, pid in workers(stack).items()},
        }
        print(f"idle: {figures['idle']}", flush=True)
        figures["one_message_running"] = reach_all(
            stack, count, args.partitions, args.reach_timeout
        )
        print(f"one message to all, running: {figures['one_message_running']}", flush=True)
        figures["load"] = load(stack, count, args.rate, args.seconds)
        print(f"load: {figures['load']}", flush=True)
        if args.failing:
            add_failing(stack, count, args.failing)
            figures["failing_running_s"] = until_called(
                stack, range(count, count + args.failing), args.reach_timeout
            )
            print(f"failing ones called after {figures['failing_running_s']} s", flush=True)
            again = load(stack, count, args.rate, args.seconds)
            figures["load_beside_failing"] = again
            figures["beside_failing"] = beside_failing(figures["load"], again)
            print(f"beside {args.failing} failing: {figures['beside_failing']}", flush=True)
        figures["new_subscription"] = first_delivery(
            stack, count + args.failing, args.new, timeout_s=120
        )
        print(f"a new subscription: {figures['new_subscription']}", flush=True)
    figures["verdicts"] = verdicts(figures)
    for name, verdict in figures["verdicts"].items():
        print(f"{name}: {verdict}")
    path = write_result("fanout", figures, f"-{args.label}" if args.label else "")
    print(f"written to {path}")


if __name__ == "__main__":
    main()
