"""The Java unit tests of the ingest job's de-duplication operator (spark/jvm/src/test) pass."""

from __future__ import annotations

from pathlib import Path

from cli import jvm
from setu.settings import Settings


def test_the_operators_java_unit_tests_pass(tmp_path: Path) -> None:
    run = jvm.run_unit_tests(Settings(), tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "0 tests failed" in run.stdout
    assert " 0 tests successful" not in run.stdout
