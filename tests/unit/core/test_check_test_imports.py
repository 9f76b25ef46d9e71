"""scripts/check_test_imports.py: tests import helpers from support modules, never from a
conftest or another test module."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "check_test_imports.py"


def checker() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_test_imports", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_imports_from_a_conftest_or_a_test_module_are_named_by_file_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given a test tree whose tests take helpers from a conftest and from another test module
    write(
        tmp_path,
        {
            "tests/a/conftest.py": "World = object\n",
            "tests/a/test_one.py": "import pytest\n\nfrom tests.a.conftest import World\n",
            "tests/a/test_two.py": (
                "def test_it() -> None:\n    from .test_one import World\nfrom . import conftest\n"
            ),
        },
    )
    # When the check runs on it
    code = checker().main([str(tmp_path)])
    # Then it fails, naming each offending import
    assert code == 1
    assert capsys.readouterr().out.splitlines() == [
        "tests/a/test_one.py:3: imports from tests.a.conftest; "
        "move what it needs into a support module and import it from there",
        "tests/a/test_two.py:2: imports from test_one; "
        "move what it needs into a support module and import it from there",
        "tests/a/test_two.py:3: imports from conftest; "
        "move what it needs into a support module and import it from there",
    ]


def test_helpers_taken_from_support_modules_pass(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given a test tree whose conftest and tests take helpers from a support module
    write(
        tmp_path,
        {
            "tests/a/support.py": "World = object\n",
            "tests/a/conftest.py": "from tests.a.support import World\n",
            "tests/a/test_one.py": "from tests.a.support import World\nfrom tests import waiting\n",
        },
    )
    # Then the check passes and says nothing
    assert checker().main([str(tmp_path)]) == 0
    assert capsys.readouterr().out == ""
