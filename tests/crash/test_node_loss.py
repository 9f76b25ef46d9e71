"""Setu on the kind of services production runs, while their nodes lose what they hold: a
three-node Kafka cluster (replication factor 3, two replicas in sync for a write) one of whose
nodes is killed and comes back with an empty disk, and a Redis with a replica behind a
Sentinel whose primary is killed and replaced by the replica (which may lack its last writes).
Setu's own processes are killed too. The checker proves that nothing accepted was lost,
reordered or delivered twice under two webhook-ids (docs/design.md §4, §7).

The long form runs these faults for hours: ``python -m bench.crash --kafka-nodes 3
--faults broker-wipe,redis-failover,...`` (README, "The crash test").
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.crash.report import summary_lines, write_report
from bench.crash.run import RunConfig, run_crash_test

pytestmark = [pytest.mark.crash, pytest.mark.integration, pytest.mark.spark, pytest.mark.long]


def test_nothing_accepted_is_lost_or_reordered_when_nodes_lose_their_disk_or_memory(
    tmp_path: Path,
) -> None:
    # Given Setu on its own three-node Kafka cluster and Redis with a replica and Sentinel,
    # a producer, and a webhook that fails some groups for a while
    config = RunConfig(
        workdir=tmp_path / "run",
        duration_s=120.0,
        groups=100,
        lanes=10,
        rate_per_second=40.0,
        own_brokers=True,
        kafka_nodes=3,
        chaos_interval_s=(3.0, 5.0),
        min_kill_events=10,
        drain_timeout_s=300.0,
        # When a Kafka node loses its disk and the Redis primary dies, besides kills of
        # Setu's processes, while messages flow
        faults=("broker-wipe", "redis-failover"),
        # (the brokers are killed in the long form; here their faults stand for them)
        chaos_only=("api", "ingest", "deliver-1", "deliver-2"),
    )
    report = run_crash_test(config)
    write_report(report, tmp_path / "report.json")
    summary = "\n".join(summary_lines(report))
    print(summary)
    # Then every check passes
    assert report["ok"], f"{summary}\nreport: {tmp_path / 'report.json'}"
    # And each fault happened: a node came back with an empty disk, a replica was promoted
    faults = report["faults_by_kind"]
    assert faults["broker-wipe"] >= 1
    assert faults["redis-failover"] >= 1
    # And Setu went on through them: after every fault the webhook got a 2xx call, and a
    # good part of the offered load (40 messages/s for 120 s) was accepted; a slow machine
    # spends more of the run waiting for processes that were killed to come back, so the
    # figure is a floor, not the rate
    resumed = report["after_fault_ms"]
    assert {kind: resumed.get(kind, {}).get("faults", 0) for kind in faults} == faults, resumed
    assert report["accepted"] >= 1_000
