"""Migrations build exactly the schema the code expects, on SQLite and PostgreSQL, both ways."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from setu.errors import DependencyUnavailable
from state import migrate
from state.schema import metadata

pytestmark = pytest.mark.integration

TABLES = {"api_keys", "projects", "topics", "subscriptions"}


def tables(url: str) -> set[str]:
    engine = sa.create_engine(url)
    try:
        return set(sa.inspect(engine).get_table_names()) - {"alembic_version"}
    finally:
        engine.dispose()


def test_upgrade_builds_the_schema_of_the_code(database_url: str) -> None:
    # When an empty database is migrated to head
    migrate.upgrade(database_url)
    # Then it is at head and matches the tables the store uses, column for column
    assert migrate.current(database_url) == migrate.head()
    engine = sa.create_engine(database_url)
    try:
        with engine.connect() as conn:
            diff = compare_metadata(MigrationContext.configure(conn), metadata)
    finally:
        engine.dispose()
    assert diff == []


def test_downgrade_to_base_removes_everything_and_upgrade_restores_it(database_url: str) -> None:
    migrate.upgrade(database_url)
    migrate.downgrade(database_url, "base")
    assert migrate.current(database_url) is None
    assert tables(database_url) == set()
    migrate.upgrade(database_url)
    assert tables(database_url) == TABLES


def test_upgrade_twice_changes_nothing(database_url: str) -> None:
    migrate.upgrade(database_url)
    migrate.upgrade(database_url)
    assert migrate.current(database_url) == migrate.head()


def test_unmigrated_database_is_refused_with_advice(database_url: str) -> None:
    with pytest.raises(DependencyUnavailable, match="run `setu migrate`"):
        migrate.require_head(database_url)
    migrate.upgrade(database_url)
    migrate.require_head(database_url)
