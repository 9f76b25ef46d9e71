"""The short crash test: a few minutes of SIGKILLs against a real Setu, then the checker's verdict.

A producer publishes ~3,000 small records over 100 groups, three of its ten lanes over
streaming produce, while a chaos loop kills and restarts the API, the Spark ingest job, the two
delivery workers, the webhook receiver and the producer itself every few seconds, and makes
Redis forget everything now and then (``FLUSHALL``). The webhook fails some groups with
503 for a while, rejects a few messages with 422, and for 12 s fails every call (an endpoint
outage, longer when chaos stalled its calls: the circuit breaker opens and closes).
Then the dead-lettered groups are unsidelined and the checker proves nothing accepted was lost,
reordered, corrupted or delivered twice under two webhook-ids. The long form is
``python -m bench.crash --duration 30m``, which also kills the Kafka broker and Redis.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bench.crash.report import summary_lines, write_report
from bench.crash.run import RunConfig, run_crash_test

pytestmark = [pytest.mark.crash, pytest.mark.integration, pytest.mark.spark]


def test_nothing_accepted_is_lost_reordered_corrupted_or_duplicated_under_kills(
    kafka_bootstrap: str, redis_url: str, tmp_path: Path
) -> None:
    # Given a Setu stack on the shared Kafka and Redis, a producer and a flaky webhook
    config = RunConfig(
        workdir=tmp_path / "run",
        duration_s=75.0,
        groups=100,
        lanes=10,
        stream_lanes=3,
        rate_per_second=40.0,
        chaos_interval_s=(3.0, 5.0),
        restart_delay_s=(0.0, 1.0),
        kafka_bootstrap=kafka_bootstrap,
        redis_url=redis_url,
        min_kill_events=10,
        drain_timeout_s=240.0,
        outage_s=12.0,
        # Redis forgets everything now and then, and the webhook receiver dies too
        faults=("redis-flush",),
        kill_receiver=True,
        # The ingest job is killed only after it committed a batch since it started: batches
        # of 10 s (30 by default) let the run kill it a few times, always mid-batch
        extra_env={"SETU_SPARK_REALTIME_BATCH_S": "10"},
        # A slow machine starts the job late: chaos goes on until it was killed twice
        min_kills_by_component={"ingest": 2},
    )
    if os.environ.get("SETU_CRASH_SEED"):
        # Replays a failed run's choices (its seed is in the report).
        config = RunConfig(**{**config.__dict__, "seed": int(os.environ["SETU_CRASH_SEED"])})
    # When components are SIGKILLed and restarted at random while it runs, then it drains
    report = run_crash_test(config)
    write_report(report, tmp_path / "report.json")
    summary = "\n".join(summary_lines(report))
    print(summary)
    # Then every check passes
    assert report["ok"], f"{summary}\nreport: {tmp_path / 'report.json'}"
    # And the run exercised what it claims: every kind of component died at least once, and
    # the webhook's failures sent some groups to the retry tiers and the dead-letter queue
    kills = report["chaos"]["kills_by_component"]
    for kind in ("api", "ingest", "deliver", "producer", "receiver"):
        assert sum(n for name, n in kills.items() if name.startswith(kind)) >= 1, kind
    assert kills["ingest"] >= 2
    assert report["faults_by_kind"]["redis-flush"] >= 1
    # (a floor, not the offered 40 messages/s: a slow machine spends more of the run waiting
    # for killed processes to come back)
    assert report["accepted"] >= 1_500
    # And three lanes of ten streamed (docs/streaming.md) through the API's kills
    assert report["acked_via"]["stream"] >= report["accepted"] // 5
    assert report["messages_failed_5xx"] >= 1
    # And some messages were scheduled (docs/scheduling.md): their groups waited behind them
    # through the kills, and none was called before its time (checked in "violations")
    assert report["scheduled_delivered"] >= 10
    assert report["messages_rejected_4xx"] >= 1
    assert report["drain"]["unsidelined_groups"] >= 1
    # And the endpoint outage opened the circuit breaker (checked in report["violations"];
    # its closing and the attempts spent are in the report); the outage lasted until it had
    # failed enough calls for the breakers to judge
    assert report["outage"]["breaker_judged"], report["outage"]
    assert report["outage"]["breaker_opened"] >= 1
