"""Streaming produce through kills of the API: 100,000 messages streamed over 1,000 groups by 20
producers (docs/streaming.md) while the API, which serves the streams, is SIGKILLed and
restarted every few seconds, and each producer drops its own connection (FIN or RST) every few
seconds besides. Each producer reconnects, resumes from its NOTIFY_ACK and resends what was not
acknowledged; the webhook must see every message once by id, each group in order.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.crash.report import summary_lines, write_report
from bench.crash.run import RunConfig, run_crash_test

pytestmark = [pytest.mark.crash, pytest.mark.integration, pytest.mark.spark, pytest.mark.long]

MESSAGES = 100_000


def test_streamed_messages_survive_api_kills_once_each_and_in_order(
    kafka_bootstrap: str, redis_url: str, tmp_path: Path
) -> None:
    # Given 20 streaming producers over 1,000 groups and a webhook that always answers 2xx
    lanes, duration_s = 20, 40.0
    config = RunConfig(
        workdir=tmp_path / "run",
        duration_s=duration_s,
        groups=1_000,
        lanes=lanes,
        stream_lanes=lanes,
        stream_drop_s=4.0,
        rate_per_second=MESSAGES / duration_s,
        chaos_only=("api",),
        kill_producer=False,
        chaos_interval_s=(5.0, 8.0),
        restart_delay_s=(0.0, 1.0),
        failing_group_fraction=0.0,
        rejected_messages=0,
        flaky_group_fraction=0.0,
        kafka_bootstrap=kafka_bootstrap,
        redis_url=redis_url,
        min_kill_events=3,
        producer_grace_s=180.0,
        drain_timeout_s=300.0,
    )
    # When the API is killed and restarted while they stream, and they drop their connections
    report = run_crash_test(config)
    write_report(report, tmp_path / "report.json")
    summary = "\n".join(summary_lines(report))
    print(summary)
    # Then every check passes: nothing lost, corrupted or out of order in any group
    assert report["ok"], f"{summary}\nreport: {tmp_path / 'report.json'}"
    # And every message was acknowledged to its producer and delivered once, by id and raw
    assert report["published"] == report["accepted"] == MESSAGES
    assert report["delivered"] == MESSAGES
    assert report["raw_duplicates"] == 0
    # And only the API died, several times, and the producers learned of their messages from
    # the streams' ACKs (or, after a kill, from NOTIFY_ACK)
    kills = report["chaos"]["kills_by_component"]
    assert kills.get("api", 0) >= 3
    assert sum(kills.values()) == kills["api"]
    assert set(report["acked_via"]) <= {"stream", "server"}
    assert report["acked_via"]["stream"] > MESSAGES / 2
    # And every producer dropped its connection both ways along the way
    assert min(report["stream_drops"].get(how, 0) for how in ("close", "reset")) >= lanes
