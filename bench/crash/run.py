"""One crash-test run, start to verdict.

1. Start the witnesses (receiver) and Setu (``setu migrate``, API, ingest job, workers; in the
   long form first its own Kafka and Redis), and create a grouped topic and a grouped ``park``
   subscription whose webhook is the receiver.
2. *Chaos*: the producer publishes while the chaos loop SIGKILLs and restarts a random
   component every few seconds (and a supervisor restarts anything that dies by itself).
3. *Drain*: chaos stops, the producer finishes (or is stopped), the receiver answers 2xx to
   everything, and the dead-lettered groups are unsidelined until every acknowledged message is
   delivered and the webhook has been quiet for a while (or a deadline passes).
4. *Verdict*: everything stops, and :func:`bench.crash.checker.check` judges the two journals.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import re
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import orjson

from bench.crash.brokers import Brokers
from bench.crash.chaos import Chaos, Component, ComponentSpec, EventLog, Fault
from bench.crash.checker import (
    DeadLetter,
    calls_from_journal,
    check_each,
    published_from_journal,
)
from bench.crash.dead_letters import read_dead_letters
from bench.crash.drain import drain
from bench.crash.faults import BrokerWipe, RedisFailover, RedisRollback, redis_flush
from bench.crash.journal import Entry, read_entries
from bench.crash.outage import outage_figures
from bench.crash.plan import PlanShape, make_plan
from bench.crash.receiver import FIRST_SUBSCRIPTION, events_journal, subscription_of
from bench.crash.setu_api import SetuApi
from bench.crash.stack import (
    SPARK_EXECUTOR_CONF,
    ProduceShape,
    StackLayout,
    migrate_argv,
    producer_journal,
    producer_spec,
    receiver_journal,
    receiver_spec,
    setu_env,
    setu_specs,
    spark_cluster,
    spark_specs,
)
from cli.ports import any_free_port
from setu import names
from setu.limits import DEFAULT_MAX_MESSAGE_BYTES
from setu.model import RetryPolicy

Say = Callable[[str], None]
DEFAULT_SECRET = "whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="


@dataclass(frozen=True)
class RunConfig:
    """Everything a run needs. Shared services are used unless ``own_brokers``."""

    workdir: Path
    duration_s: float
    groups: int = 1000
    # Grouped subscriptions of the run's one topic, each with its own endpoint path at the
    # receiver and judged on its own: "hook" (at /hook), then "hook-002", ... (issue 34).
    subscriptions: int = 1
    lanes: int = 20
    # The last lanes produce over streaming produce (docs/streaming.md) instead of HTTP.
    stream_lanes: int = 0
    # Each streaming lane drops its connection about this often (s; 0: never).
    stream_drop_s: float = 0.0
    rate_per_second: float = 40.0
    partitions: int = 6
    workers: int = 2
    chaos_interval_s: tuple[float, float] = (3.0, 6.0)
    restart_delay_s: tuple[float, float] = (0.0, 1.0)
    own_brokers: bool = False
    kafka_bootstrap: str | None = None
    redis_url: str | None = None
    database_url: str | None = None
    retry_delays_ms: tuple[int, ...] = (200, 500, 1000)
    webhook_timeout_ms: int = 5_000
    kill_producer: bool = True
    # Only these components are killed (None: every one); the producer still by kill_producer.
    chaos_only: tuple[str, ...] | None = None
    # The webhook receiver is killed too (its journal survives: bench/crash/journal.py).
    kill_receiver: bool = False
    # Faults besides kills (bench/crash/faults.py): "redis-flush", and with own brokers
    # "redis-rollback" and "redis-failover" (which runs Redis with a replica and Sentinel),
    # and on a cluster (kafka_nodes 3) "broker-wipe".
    faults: tuple[str, ...] = ()
    # With own brokers: Kafka as one broker, or a KRaft cluster of three (replication 3).
    kafka_nodes: int = 1
    failing_group_fraction: float = 0.1
    rejected_messages: int = 5
    flaky_group_fraction: float = 0.05
    startup_timeout_s: float = 180.0
    producer_grace_s: float = 60.0
    drain_timeout_s: float = 300.0
    quiet_s: float = 5.0
    min_kill_events: int = 1
    # Chaos goes on past ``duration_s`` (by at most ``max_extension_s``) until each of these
    # components was killed this often: a slow machine starts the ingest job late, and a short
    # run would otherwise kill it less often than the run means to.
    min_kills_by_component: dict[str, int] = field(default_factory=dict)
    max_extension_s: float = 120.0
    signing_secret: str | None = DEFAULT_SECRET
    seed: int = field(default_factory=lambda: random.randrange(2**31))
    extra_env: dict[str, str] = field(default_factory=dict)
    # 0: the ingest job runs Spark in its own process (local[2]). N: on a local standalone
    # cluster of N one-core workers, which the chaos loop kills too (cluster mode).
    spark_workers: int = 0
    # An endpoint outage this long (0: none), 40 % into the run: every call fails, so the
    # subscription's circuit breaker opens, probes and closes (docs/policies.md §2).
    outage_s: float = 0.0
    circuit_breaker: dict[str, Any] = field(
        default_factory=lambda: {
            "failure_ratio": 0.5,
            "min_calls": 5,
            "window_s": 10,
            "open_s": 2,
        }
    )


def subscription_names(count: int) -> list[str]:
    """The run's subscriptions: the first is the receiver's ``/hook``, the others
    ``/hook/{name}``."""
    return [FIRST_SUBSCRIPTION] + [f"{FIRST_SUBSCRIPTION}-{i:03d}" for i in range(2, count + 1)]


def migrate(layout: StackLayout) -> None:
    """``setu migrate`` once, before any Setu process starts; raises if it fails."""
    log_path = layout.logs / "migrate.log"
    with log_path.open("ab") as log:
        result = subprocess.run(migrate_argv(), env=setu_env(layout), stdout=log, stderr=log)
    if result.returncode != 0:
        raise RuntimeError(f"setu migrate failed ({result.returncode}); see {log_path}")


def delivery_resumed(
    events: list[dict[str, Any]], calls: list[dict[str, Any]]
) -> dict[str, dict[str, int]]:
    """Per fault kind, how long after each fault the webhook got its next 2xx call: the
    median and the longest (ms). Faults come every few seconds, so this is an upper bound on
    a recovery only where it stays well below the chaos interval."""
    delivered = sorted(int(c["t"]) for c in calls if 200 <= int(c["status"]) < 300)
    waits: dict[str, list[int]] = {}
    for event in events:
        if event["action"] != "fault":
            continue
        at = int(event["t"])
        later = next((t for t in delivered if t >= at), None)
        if later is not None:
            waits.setdefault(str(event["component"]), []).append(later - at)
    return {
        kind: {"median": sorted(ms)[len(ms) // 2], "max": max(ms), "faults": len(ms)}
        for kind, ms in waits.items()
    }


class CrashRun:
    """The state of one run; :meth:`execute` returns the report."""

    def __init__(self, config: RunConfig, say: Say = print) -> None:
        self.config = config
        self.say = say
        self.run_id = f"c{uuid.uuid4().hex[:10]}"
        self.project = f"crash-{self.run_id}"
        self.topic = "events"
        self.subscriptions = subscription_names(config.subscriptions)
        config.workdir.mkdir(parents=True, exist_ok=True)
        self.events = EventLog(config.workdir / "chaos.journal")
        self.components: dict[str, Component] = {}
        self.timings: dict[str, float] = {}
        self.flaky_groups: list[str] = []
        self.outage: tuple[int, int] | None = None
        self.brokers: Brokers | None = None
        self.rng = random.Random(config.seed)
        self._started = time.monotonic()
        self.chaos_extended_s = 0.0

    async def execute(self) -> dict[str, Any]:
        config = self.config
        self._log(f"run {self.run_id} in {config.workdir} (seed {config.seed})")
        try:
            layout = await self._start_brokers()
            async with httpx.AsyncClient(
                base_url=layout.api_url, timeout=10.0, headers=layout.auth()
            ) as client:
                api = SetuApi(client, self.project, self.topic, self.subscriptions[0])
                await self._set_up(layout, api)
                self._mark("setup_s")
                await self._chaos(layout)
                self._mark("chaos_s")
                async with httpx.AsyncClient(
                    # The receiver serves every subscription's calls too: on a loaded host its
                    # answer to the drain's control request took more than httpx's 5 s.
                    base_url=layout.receiver_url,
                    timeout=60.0,
                ) as receiver:
                    drained = await drain(
                        [api.named(name) for name in self.subscriptions],
                        receiver,
                        producer_journal(layout),
                        receiver_journal(layout),
                        timeout_s=config.drain_timeout_s,
                        quiet_s=config.quiet_s,
                        say=self._log,
                    )
                self._mark("drain_s")
                dead_letters = await asyncio.to_thread(
                    read_dead_letters,
                    layout.kafka_bootstrap,
                    [names.dlq_topic(self.project, name) for name in self.subscriptions],
                    config.partitions,
                    RetryPolicy(delays_ms=config.retry_delays_ms),
                )
        finally:
            self._stop_all()
            self.events.close()
        by_name = {name: names.dlq_topic(self.project, name) for name in self.subscriptions}
        return self._verdict(
            layout, drained, {name: dead_letters[topic] for name, topic in by_name.items()}
        )

    async def _start_brokers(self) -> StackLayout:
        config = self.config
        if config.own_brokers:
            from bench.crash.brokers import prepare_brokers

            brokers = prepare_brokers(
                config.workdir,
                kafka_nodes=config.kafka_nodes,
                sentinel="redis-failover" in config.faults,
            )
            self.brokers = brokers
            # A cluster's nodes need one another to start: all of them first, then the wait.
            for spec in brokers.specs:
                self._start(spec)
            for name, ready in brokers.ready.items():
                await self._await(ready, name, config.startup_timeout_s)
            kafka, redis_url = brokers.kafka_bootstrap, brokers.redis_url
        else:
            if not (config.kafka_bootstrap and config.redis_url):
                raise ValueError("without own_brokers, kafka_bootstrap and redis_url are needed")
            kafka, redis_url = config.kafka_bootstrap, config.redis_url
        database = config.database_url or f"sqlite:///{config.workdir / 'setu.db'}"
        spark_env = await self._start_spark_cluster() if config.spark_workers else {}
        return StackLayout(
            workdir=config.workdir,
            api_port=any_free_port(),
            stream_port=any_free_port(),
            receiver_port=any_free_port(),
            kafka_bootstrap=kafka,
            redis_url=redis_url,
            database_url=database,
            workers=config.workers,
            extra_env={
                **self._ingest_scope(),
                **spark_env,
                **(self.brokers.redis.setu_env() if self.brokers else {}),
                # Three replicas, two in sync for an acknowledgement, on a cluster of three
                **(
                    {"SETU_KAFKA_REPLICATION_FACTOR": str(config.kafka_nodes)}
                    if config.own_brokers and config.kafka_nodes > 1
                    else {}
                ),
                **config.extra_env,
            },
        )

    async def _start_spark_cluster(self) -> dict[str, str]:
        """A master (never killed) and ``spark_workers`` workers (killed like any component,
        each with its executor); the variables that put the ingest job on them."""
        cluster = spark_cluster(self.config.workdir, self.config.spark_workers, any_free_port)
        for spec in spark_specs(cluster, self.config.workdir):
            self._start(spec)
        self._log(f"starting a Spark cluster of {cluster.workers} worker(s)")
        await self._await(
            lambda: cluster.alive_workers() == cluster.workers,
            "spark workers",
            self.config.startup_timeout_s,
        )
        return {
            "SETU_SPARK_MASTER": cluster.master_url,
            "SETU_SPARK_CONF": orjson.dumps(SPARK_EXECUTOR_CONF).decode(),
        }

    def _ingest_scope(self) -> dict[str, str]:
        """Keeps the ingest job to this run's topic: on a shared broker, reading every other
        test's ingest topics from their first offset makes its batches slow and its restarts
        long. With the shared ingest log, the run has one of its own."""
        pattern = f"^{re.escape(names.ingest_topic(self.project, self.topic))}$"
        if self.config.extra_env.get("SETU_INGEST_LOG") != "shared":
            return {"SETU_SPARK_INGEST_PATTERN": pattern}
        shared = f"{names.SHARED_INGEST_LOG}-{self.run_id}"
        return {
            "SETU_INGEST_LOG_TOPIC": shared,
            "SETU_SPARK_INGEST_PATTERN": names.with_shared_log(pattern, shared),
        }

    async def _set_up(self, layout: StackLayout, api: SetuApi) -> None:
        config = self.config
        layout.logs.mkdir(parents=True, exist_ok=True)
        self._log("migrating the metadata store")
        await asyncio.to_thread(migrate, layout)
        per_lane = max(1, round(config.rate_per_second * config.duration_s / config.lanes))
        start_ms = int(time.time() * 1000) + 5_000
        plan = make_plan(
            PlanShape(
                run_id=self.run_id,
                groups=config.groups,
                lanes=config.lanes,
                messages_per_lane=per_lane,
                start_ms=start_ms,
                span_ms=int(config.duration_s * 1000),
                failing_group_fraction=config.failing_group_fraction,
                rejected_messages=config.rejected_messages,
                flaky_group_fraction=config.flaky_group_fraction,
                max_flaky_failures=min(2, len(config.retry_delays_ms)),
                outage_ms=int(config.outage_s * 1000),
                # Twice what every worker's breaker needs: one killed part-way still leaves
                # the others their minimum
                outage_min_failures=2 * self._breaker_min_calls(),
                stream_lanes=config.stream_lanes,
            ),
            config.seed,
        )
        self.outage = plan.outage
        self.flaky_groups = sorted(plan.flaky)
        plan_path = config.workdir / "plan.json"
        plan_path.write_bytes(orjson.dumps(plan.to_json()))
        self._start(receiver_spec(layout, plan_path, config.signing_secret))
        await self._await_http(f"{layout.receiver_url}/control/stats", "receiver")
        specs = {spec.name: spec for spec in setu_specs(layout)}
        self._start(specs.pop("api"))
        self._log("waiting for the API")
        await api.wait_healthy(config.startup_timeout_s)
        await api.create_resources(
            partitions=config.partitions,
            endpoint_url=f"{layout.receiver_url}/hook",
            retry_delays_ms=list(config.retry_delays_ms),
            signing_secret=config.signing_secret,
            timeout_ms=config.webhook_timeout_ms,
            circuit_breaker=config.circuit_breaker,
            events_url=f"{layout.receiver_url}/events",
        )
        for name in self.subscriptions[1:]:
            await api.named(name).create_subscription(
                endpoint_url=f"{layout.receiver_url}/hook/{name}",
                retry_delays_ms=list(config.retry_delays_ms),
                signing_secret=config.signing_secret,
                timeout_ms=config.webhook_timeout_ms,
                circuit_breaker=config.circuit_breaker,
            )
        if len(self.subscriptions) > 1:
            self._log(f"{len(self.subscriptions)} subscriptions of {self.topic!r}")
        for spec in specs.values():
            self._start(spec)
        shape = ProduceShape(
            project=self.project,
            topic=self.topic,
            run_id=self.run_id,
            groups=config.groups,
            lanes=config.lanes,
            messages_per_lane=per_lane,
            rate_per_second=config.rate_per_second,
            large_body_bytes=DEFAULT_MAX_MESSAGE_BYTES,  # the API's limit in the run
            stream_lanes=config.stream_lanes,
            stream_drop_s=config.stream_drop_s,
        )
        self._start(producer_spec(layout, shape, chaos=config.kill_producer))
        self._log(f"producing {per_lane * config.lanes} records over {config.groups} groups")

    def _breaker_min_calls(self) -> int:
        """Failed calls the outage needs before every worker's breaker could have opened: each
        worker's breaker counts its own calls (docs/policies.md §2)."""
        per_worker = int((self.config.circuit_breaker or {}).get("min_calls", 1))
        return per_worker * self.config.workers

    def _kills_short(self) -> dict[str, int]:
        """Components killed fewer times than ``min_kills_by_component`` asks: name -> kills."""
        short = {}
        for name, wanted in self.config.min_kills_by_component.items():
            kills = self.events.count("kill", name)
            if kills < wanted:
                short[name] = kills
        return short

    async def _until_min_kills(self, hard_deadline: float) -> None:
        """Keeps chaos going until every component had its minimum of kills, or until
        ``hard_deadline``; the report says how long chaos ran past its duration."""
        started = time.monotonic()
        while (short := self._kills_short()) and time.monotonic() < hard_deadline:
            self._log(f"chaos goes on: too few kills of {short}")
            await asyncio.sleep(min(5.0, max(0.0, hard_deadline - time.monotonic())))
        self.chaos_extended_s = round(time.monotonic() - started, 1)

    async def _chaos(self, layout: StackLayout) -> None:
        config = self.config
        rng = self.rng
        chaos = Chaos(
            list(self.components.values()),
            self.events,
            rng,
            config.chaos_interval_s,
            config.restart_delay_s,
            self._faults(layout),
            self._settled(),
        )
        stop_chaos, stop_supervisor = asyncio.Event(), asyncio.Event()
        supervisor = asyncio.create_task(chaos.supervise(stop_supervisor))
        killer = asyncio.create_task(chaos.run(stop_chaos))
        try:
            deadline = time.monotonic() + config.duration_s
            while time.monotonic() < deadline:
                await asyncio.sleep(min(10.0, max(0.0, deadline - time.monotonic())))
                self._log(f"chaos: {self.events.count('kill')} kills so far")
            await self._until_min_kills(deadline + config.max_extension_s)
            stop_chaos.set()
            await killer
            self._log("chaos over; waiting for the producer to finish")
            await self._await(
                lambda: self.components["producer"].finished,
                "producer",
                config.producer_grace_s,
                required=False,
            )
        finally:
            stop_chaos.set()
            stop_supervisor.set()
            await asyncio.gather(killer, supervisor, return_exceptions=True)
        producer = self.components["producer"]
        if producer.alive:
            self._log("producer did not finish in time: stopping it")
            producer.stop()
        # Everything of Setu must run for the drain, whatever chaos left behind.
        for component in self.components.values():
            if component.name != "producer" and not component.alive:
                component.start()
                self.events.record(component.name, "restart")

    def _settled(self) -> dict[str, Callable[[], bool]]:
        """Per domain of nodes, whether one may go down now (``Chaos``)."""
        cluster = self.brokers.cluster if self.brokers else None
        if cluster is None:
            return {}

        def in_sync() -> bool:
            from cli.kafka_local import KafkaUnavailable

            try:
                return not cluster.lagging()
            except KafkaUnavailable:
                return False

        return {"kafka": in_sync}

    def _faults(self, layout: StackLayout) -> dict[str, Fault]:
        faults: dict[str, Fault] = {}
        for name in self.config.faults:
            if name == "redis-flush":
                where = self.brokers.redis.primary_url if self.brokers else lambda: layout.redis_url
                faults[name] = partial(redis_flush, where)
            elif name == "redis-rollback":
                if self.brokers is None:
                    raise ValueError("redis-rollback needs the run's own brokers")
                faults[name] = RedisRollback(
                    self.brokers.redis, self.components, self.brokers.ready["redis"]
                )
            elif name == "redis-failover":
                if self.brokers is None or self.brokers.redis.sentinel is None:
                    raise ValueError("redis-failover needs the run's own Redis with Sentinel")
                faults[name] = RedisFailover(self.brokers.redis, self.components)
            elif name == "broker-wipe":
                if self.brokers is None or self.brokers.cluster is None:
                    raise ValueError("broker-wipe needs the run's own cluster (kafka_nodes 3)")
                faults[name] = BrokerWipe(self.brokers.cluster, self.components, self.rng)
            else:
                raise ValueError(f"unknown fault {name!r}")
        return faults

    def _verdict(
        self,
        layout: StackLayout,
        drained: dict[str, Any],
        dead_letters: dict[str, list[DeadLetter]],
    ) -> dict[str, Any]:
        every_call = read_entries(receiver_journal(layout))
        produced = read_entries(producer_journal(layout))
        by_subscription: dict[str, list[Entry]] = {name: [] for name in self.subscriptions}
        for entry in every_call:
            by_subscription.setdefault(subscription_of(entry), []).append(entry)
        # The first subscription's calls stand for the run where one is enough (the outage's
        # figures, the recoveries after faults).
        calls = by_subscription[self.subscriptions[0]]
        report = check_each(
            published_from_journal(produced),
            {name: calls_from_journal(made) for name, made in by_subscription.items()},
            dead_letters,
            retry_tiers=len(self.config.retry_delays_ms),
            flaky_groups=self.flaky_groups,
        )
        events = read_entries(events_journal(receiver_journal(layout)))
        report["events"] = dict(Counter(str(e["type"]) for e in events))
        # How the producer learned each acknowledgement: http, stream, or server (on resume)
        report["acked_via"] = dict(Counter(str(e["via"]) for e in produced if e["e"] == "ack"))
        report["stream_drops"] = dict(Counter(str(e["how"]) for e in produced if e["e"] == "drop"))
        if self.outage is not None:
            length = self.outage[1] - self.outage[0]
            min_calls = self._breaker_min_calls()
            report["outage"] = outage_figures(length, calls, events, min_calls)
            report["violations"] = report["violations"] + report["outage"]["violations"]
        kills = self.events.count("kill")
        names = sorted({e["component"] for e in self.events.events})
        report["kill_restart_events"] = kills
        report["fault_events"] = self.events.count("fault")
        report["faults_by_kind"] = {f: self.events.count("fault", f) for f in self.config.faults}
        report["faults_skipped"] = {
            f: self.events.count("fault_skipped", f) for f in self.config.faults
        }
        report["after_fault_ms"] = delivery_resumed(self.events.events, calls)
        failed_faults = self.events.count("fault_failed")
        report["chaos"] = {
            "kills_by_component": {n: self.events.count("kill", n) for n in names},
            # Exits other than a kill or a finished producer (each fails the run)
            "exits_by_component": {
                n: sum(e["component"] == n for e in self.events.exits_on_their_own()) for n in names
            },
            "extended_s": self.chaos_extended_s,
        }
        report["drain"] = drained
        exits = self.events.exits_on_their_own()
        report["exits_on_their_own"] = exits[:10]
        extra = []
        if exits:
            extra.append("components_exited_on_their_own")
        if report["accepted"] == 0:
            extra.append("nothing_accepted")
        if kills + report["fault_events"] < self.config.min_kill_events:
            extra.append("too_few_kill_events")
        if self._kills_short():
            extra.append("too_few_kills_of_a_component")
        if failed_faults:
            extra.append("faults_failed")
        if not drained["quiescent"]:
            extra.append("never_quiescent")
        report["violations"] = report["violations"] + extra
        report["ok"] = not report["violations"]
        report["run"] = {
            "run_id": self.run_id,
            "project": self.project,
            "workdir": str(self.config.workdir),
            "config": {
                k: (str(v) if isinstance(v, Path) else v)
                for k, v in asdict(self.config).items()
                if k != "signing_secret"
            },
        }
        report["timings"] = {**self.timings, "total_s": round(time.monotonic() - self._started, 1)}
        return report

    def _start(self, spec: ComponentSpec) -> None:
        if spec.name == "receiver" and self.config.kill_receiver:
            spec = replace(spec, chaos=True, min_uptime_s=2.0)
        only = self.config.chaos_only
        if only is not None and spec.name != "producer" and spec.name not in only:
            spec = replace(spec, chaos=False)
        component = Component(spec, self.events)
        self.components[spec.name] = component
        component.start()

    def _stop_all(self) -> None:
        # Producer and Setu first, so the receiver still journals their last calls; brokers last.
        order = ["producer", "api", "ingest"]
        names = sorted(self.components, key=lambda n: order.index(n) if n in order else 10)
        late = [
            n
            for n in (
                "receiver",
                "redis",
                "redis-replica",
                "sentinel",
                "kafka",
                "kafka-1",
                "kafka-2",
                "kafka-3",
            )
            if n in self.components
        ]
        for name in [n for n in names if n not in late] + late:
            with contextlib.suppress(OSError):
                self.components[name].stop()

    async def _await_http(self, url: str, what: str) -> None:
        async def answers() -> bool:
            async with httpx.AsyncClient(timeout=2.0) as client:
                try:
                    return (await client.get(url)).is_success
                except httpx.HTTPError:
                    return False

        deadline = time.monotonic() + self.config.startup_timeout_s
        while not await answers():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what} did not answer at {url}")
            await asyncio.sleep(0.2)

    async def _await(
        self, ready: Callable[[], bool], what: str, timeout_s: float, *, required: bool = True
    ) -> bool:
        deadline = time.monotonic() + timeout_s
        while not await asyncio.to_thread(ready):
            if time.monotonic() > deadline:
                if required:
                    raise TimeoutError(f"{what} not ready after {timeout_s:.0f} s")
                return False
            await asyncio.sleep(0.5)
        return True

    def _mark(self, name: str) -> None:
        now = time.monotonic()
        self.timings[name] = round(now - self._started - sum(self.timings.values()), 1)

    def _log(self, line: str) -> None:
        self.say(f"[crash {time.monotonic() - self._started:6.1f}s] {line}")


def run_crash_test(config: RunConfig, say: Say = print) -> dict[str, Any]:
    """Run one crash test and return its report (``report["ok"]`` is the verdict)."""
    return asyncio.run(CrashRun(config, say).execute())
