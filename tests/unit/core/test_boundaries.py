"""The core imports no adapter: the ordering model and the shared core stay pure
(docs/design.md §4), whatever the processes around them use."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
ADAPTERS = ("state", "delivery", "api", "spark", "cli", "bench", "redis", "confluent_kafka")


def imported(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


@pytest.mark.parametrize(
    "path", sorted((ROOT / "setu" / "ordering").glob("*.py")), ids=lambda p: p.name
)
def test_the_ordering_model_imports_no_adapter(path: Path) -> None:
    assert not imported(path) & set(ADAPTERS)
