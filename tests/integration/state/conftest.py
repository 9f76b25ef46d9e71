"""Databases for the store's contract tests: a fresh SQLite file and a fresh PostgreSQL
database (``pg_url``, tests/conftest.py) per test, so tests never see each other's rows."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'setu.db'}"


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest) -> str:
    """Each contract test runs once on SQLite and once on PostgreSQL."""
    fixture = "sqlite_url" if request.param == "sqlite" else "pg_url"
    return str(request.getfixturevalue(fixture))
