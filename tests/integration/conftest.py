"""Every test under tests/integration carries the ``integration`` mark, whether its module
says so or not: ``-m "not integration"`` must never run one that needs the services."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in item.path.resolve().parents:
            item.add_marker(pytest.mark.integration)
