#!/usr/bin/env python3
"""Test modules share helpers through support modules, never through each other.

Fails (exit 1, naming file:line) when a module under tests/ imports from a ``conftest`` module
(pytest loads those itself; what a test needs from one belongs in a support module beside it)
or from a module whose file name starts with ``test_`` (importing a test module runs, and may
collect, its tests a second time)."""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _forbidden(module: str) -> bool:
    """Whether the dotted ``module`` names a conftest or a test module (by its last part)."""
    last = module.rsplit(".", 1)[-1]
    return last == "conftest" or last.startswith("test_")


def _imported_modules(node: ast.Import | ast.ImportFrom) -> Iterator[str]:
    """The modules an import statement takes something from (relative ones without dots)."""
    if isinstance(node, ast.Import):
        for alias in node.names:
            yield alias.name
        return
    if node.module is not None:
        yield node.module
    # ``from package import test_module``: the names may themselves be modules.
    for alias in node.names:
        yield alias.name if node.module is None else f"{node.module}.{alias.name}"


def offending_imports(source: str, filename: str = "<string>") -> list[tuple[int, str]]:
    """(line, module) of each import in ``source`` from a conftest or a test module."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import | ast.ImportFrom):
            for module in _imported_modules(node):
                if _forbidden(module):
                    found.append((node.lineno, module))
                    break
    return sorted(found)


def check(paths: Iterable[Path], root: Path) -> list[str]:
    """One ``file:line: ...`` complaint per offending import in ``paths``, files named
    relative to ``root``."""
    complaints = []
    for path in sorted(paths):
        name = path.relative_to(root) if path.is_relative_to(root) else path
        for line, module in offending_imports(path.read_text(encoding="utf-8"), str(path)):
            complaints.append(
                f"{name}:{line}: imports from {module}; "
                "move what it needs into a support module and import it from there"
            )
    return complaints


def main(argv: list[str]) -> int:
    root = Path(argv[0]).resolve() if argv else ROOT
    complaints = check((root / "tests").rglob("*.py"), root)
    for complaint in complaints:
        print(complaint)
    return 1 if complaints else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
