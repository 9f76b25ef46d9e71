"""What every benchmark relies on to measure only its own servers, and to say where it ran."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench import machine
from bench.machine import ServerDidNotStart, wait_for_own_server


def test_an_answer_while_the_own_server_is_dead_stops_the_benchmark() -> None:
    # Given a server process that exits at once (its port was taken, say), while something
    # else answers on that port
    process = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    process.wait(10)
    # When the benchmark waits for it, then it stops with the reason instead of measuring
    with pytest.raises(ServerDidNotStart, match="exited with code 3"):
        wait_for_own_server(process, "the API", lambda: True, timeout_s=5)


def test_a_live_server_that_answers_is_accepted() -> None:
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        wait_for_own_server(process, "the API", lambda: True, timeout_s=5)
    finally:
        process.kill()
        process.wait(10)


def test_a_server_that_never_answers_is_stopped_and_reported() -> None:
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    with pytest.raises(ServerDidNotStart, match="did not answer"):
        wait_for_own_server(process, "the API", lambda: False, timeout_s=0.5)
    assert process.wait(10) is not None


def test_every_result_states_the_machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(machine, "RESULTS", tmp_path)
    path = machine.write_result("latency", {"phases": {}}, "-before")
    written = json.loads(path.read_text())
    assert path.name.startswith("latency-") and path.name.endswith("-before.json")
    assert written["machine"]["cores"] >= 1
    assert len(written["machine"]["load_average"]) == 3
    assert written["phases"] == {}
