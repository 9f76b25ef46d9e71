"""The witnesses run as real processes, exactly as a crash run starts them."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import orjson

from bench.crash.chaos import Component, EventLog
from bench.crash.journal import read_entries
from bench.crash.plan import FailurePlan
from bench.crash.stack import StackLayout, receiver_journal, receiver_spec
from cli.ports import any_free_port


def wait_answering(url: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1.0).is_success:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"{url} did not answer")


def test_receiver_process_survives_a_restart_with_its_journal(tmp_path: Path) -> None:
    # Given the receiver started as a crash run starts it, with group g-down failing
    layout = StackLayout(
        workdir=tmp_path,
        api_port=0,
        receiver_port=any_free_port(),
        kafka_bootstrap="unused",
        redis_url="unused",
        database_url="unused",
    )
    plan = FailurePlan(windows={"g-down": ((0, 2**62),)})
    (tmp_path / "plan.json").write_bytes(orjson.dumps(plan.to_json()))
    receiver = Component(receiver_spec(layout, tmp_path / "plan.json", None), EventLog())
    receiver.start()
    try:
        wait_answering(f"{layout.receiver_url}/control/stats")
        # When Setu calls it for a healthy and a failing group, and it is killed and restarted
        headers = {"X_MESSAGE_ID": "m1", "X_GROUP_ID": "g1", "webhook-id": "m1"}
        ok = httpx.post(f"{layout.receiver_url}/hook", content=b"a", headers=headers)
        receiver.kill()
        receiver.start()
        wait_answering(f"{layout.receiver_url}/control/stats")
        headers = {"X_MESSAGE_ID": "m2", "X_GROUP_ID": "g-down", "webhook-id": "m2"}
        failed = httpx.post(f"{layout.receiver_url}/hook", content=b"b", headers=headers)
    finally:
        receiver.stop()
    # Then both answers follow the plan and both calls are in the one journal
    assert (ok.status_code, failed.status_code) == (200, 503)
    entries = read_entries(receiver_journal(layout))
    assert [(e["mid"], e["status"]) for e in entries] == [("m1", 200), ("m2", 503)]
