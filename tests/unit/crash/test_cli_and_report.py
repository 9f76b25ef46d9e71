"""The long form's argument parsing and the printed summary."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from bench.crash.__main__ import build_parser, parse_duration, parse_range
from bench.crash.checker import Call, Published, check
from bench.crash.report import summary_lines, write_report


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90", 90.0), ("90s", 90.0), ("30m", 1800.0), ("1.5h", 5400.0), (" 2m ", 120.0)],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "m", "30x", "-5m", "1h30m"])
def test_parse_duration_refuses_nonsense(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


@pytest.mark.parametrize(("text", "pair"), [("3,8", (3.0, 8.0)), ("5", (5.0, 5.0))])
def test_parse_range(text: str, pair: tuple[float, float]) -> None:
    assert parse_range(text) == pair


@pytest.mark.parametrize("text", ["8,3", "1,2,3", "-1,2"])
def test_parse_range_refuses_nonsense(text: str) -> None:
    with pytest.raises(ValueError):
        parse_range(text)


def test_long_form_defaults_to_thirty_minutes_with_its_own_brokers() -> None:
    args = build_parser().parse_args([])
    assert args.duration == 1800.0
    assert args.shared is False


def test_summary_marks_each_check_and_the_report_round_trips(tmp_path: Path) -> None:
    # Given a run that lost one message and duplicated another
    published = [Published("a1", "a", "h1", True), Published("a2", "a", "h2", True)]
    calls = [Call("a1", "a", "a1", 200, "h1"), Call("a1", "a", "a1", 200, "h1")]
    report = check(published, calls)
    report["kill_restart_events"] = 7
    # Then the summary fails it on loss only, and shows the raw duplicate and the kills
    lines = summary_lines(report)
    assert lines[0] == "crash test: FAIL"
    assert [line.split()[0] for line in lines if "FAIL" in line][1:] == ["FAIL"]
    assert any("accepted messages lost" in line and line.rstrip().endswith("1") for line in lines)
    assert any("raw duplicate calls" in line and line.rstrip().endswith("1") for line in lines)
    assert any("kill/restart events" in line and line.rstrip().endswith("7") for line in lines)
    write_report(report, tmp_path / "r" / "report.json")
    assert orjson.loads((tmp_path / "r" / "report.json").read_bytes()) == report


def test_the_summary_shows_a_component_that_exited_on_its_own_with_its_log() -> None:
    # Given a run in which the ingest job exited by itself once
    report = check([Published("a1", "a", "h1", True)], [Call("a1", "a", "a1", 200, "h1")])
    log = "starting\ningest job failed: redis.exceptions.ConnectionError: refused"
    report["exits_on_their_own"] = [{"component": "ingest", "code": 1, "log": log}]
    # Then the summary names it and shows why
    lines = summary_lines(report)
    assert "  ingest exited on its own (code 1); the end of its log:" in lines
    assert "    | ingest job failed: redis.exceptions.ConnectionError: refused" in lines
