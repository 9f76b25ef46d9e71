"""Every finding of the outside probe keeps a regression test that runs its reproducer."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.findings import FINDINGS

TESTS = Path(__file__).resolve().parents[1]


def marked_findings() -> dict[str, list[str]]:
    """Finding id -> the tests marked ``@pytest.mark.finding(id, ...)``, from the test tree."""
    found: dict[str, list[str]] = {}
    for path in TESTS.rglob("test_*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for decorator in node.decorator_list:
                if (
                    isinstance(decorator, ast.Call)
                    and ast.unparse(decorator.func) == "pytest.mark.finding"
                ):
                    for arg in decorator.args:
                        assert isinstance(arg, ast.Constant), ast.unparse(decorator)
                        found.setdefault(str(arg.value), []).append(f"{path.name}::{node.name}")
    return found


def test_every_finding_has_a_regression_test_and_every_mark_names_a_finding() -> None:
    marked = marked_findings()
    assert sorted(set(FINDINGS) - set(marked)) == []
    assert sorted(set(marked) - set(FINDINGS)) == []
