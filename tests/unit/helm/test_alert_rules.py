"""The chart's alert rules as Prometheus itself evaluates them (``promtool``, from Debian's
``prometheus`` package): the rules file loads, and each alert fires on its condition with the
labels and text an operator reads, and stays quiet when healthy (alerts_test.yaml here)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
RULES = HERE.parents[2] / "helm" / "setu" / "files" / "alerts.yaml"
CASES = HERE / "alerts_test.yaml"


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    tool = shutil.which("promtool")
    assert tool is not None, "promtool is missing: scripts/install installs Debian's prometheus"
    return subprocess.run(
        [tool, *args], cwd=HERE, capture_output=True, text=True, check=False, timeout=120
    )


def test_the_rules_file_loads_in_prometheus() -> None:
    run = promtool("check", "rules", str(RULES))
    assert run.returncode == 0, run.stdout + run.stderr


def test_every_alert_fires_on_its_condition_and_stays_quiet_when_healthy() -> None:
    run = promtool("test", "rules", CASES.name)
    assert run.returncode == 0, run.stdout + run.stderr
    # And no alert goes without its cases
    rules = yaml.safe_load(RULES.read_text())
    alerts = {rule["alert"] for group in rules["groups"] for rule in group["rules"]}
    cases = yaml.safe_load(CASES.read_text())["tests"]
    tested = {t["alertname"] for case in cases for t in case["alert_rule_test"]}
    firing = {t["alertname"] for case in cases for t in case["alert_rule_test"] if t["exp_alerts"]}
    assert alerts == tested == firing
