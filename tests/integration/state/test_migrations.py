"""Migrations build exactly the schema the code expects, on SQLite and PostgreSQL, both ways."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from setu.errors import DependencyUnavailable
from state import migrate
from state.metadata import MetadataStore
from state.schema import metadata
from state.sealing import Sealer

pytestmark = pytest.mark.integration

TABLES = {
    "api_keys",
    "projects",
    "topics",
    "subscriptions",
    "notifications",
    "replays",
    "replay_partitions",
    "schedule_cancels",
}


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


def test_a_database_older_than_the_code_is_refused(database_url: str) -> None:
    migrate.upgrade(database_url, "0005")
    with pytest.raises(DependencyUnavailable, match="at revision 0005, this code needs"):
        migrate.require_head(database_url)


def test_a_database_a_newer_release_migrated_is_served(
    database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a database migrated by the next release's pre-upgrade hook (a revision this code
    # does not know), as during an upgrade, when a pod of this release (re)starts
    migrate.upgrade(database_url)
    engine = sa.create_engine(database_url)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text("UPDATE alembic_version SET version_num = '9999_next_release'"))
    finally:
        engine.dispose()
    # Then it starts, saying why
    with caplog.at_level("WARNING", logger="state.migrate"):
        migrate.require_head(database_url)
    assert "newer than this code's" in caplog.text


def test_secrets_stored_before_sealing_are_sealed_by_the_upgrade_and_need_the_key(
    database_url: str,
) -> None:
    # Given a database at 0002 holding a subscription with a plain signing secret and header
    migrate.upgrade(database_url, "0002")
    engine = sa.create_engine(database_url)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text("INSERT INTO projects VALUES ('p', '', 1)"))
            conn.execute(sa.text("INSERT INTO topics VALUES ('p', 't', true, 1, 1, false, 1)"))
            conn.execute(
                sa.text(
                    "INSERT INTO subscriptions (project, name, topic, grouped, endpoint_url,"
                    " endpoint_method, endpoint_headers, endpoint_timeout_ms, retry_delays_ms,"
                    " dead_letter_policy, max_in_flight, signing_secret, state, deleting,"
                    " version, seek_generation, created_at_ms, updated_at_ms) VALUES ('p', 's',"
                    " 't', true, 'https://h/x', 'POST', :headers, 1000, '[1]', 'park', 1,"
                    " 'whsec_b2xkLXBsYWluLXNlY3JldC0x', 'running', false, 1, 0, 7, 7)"
                ),
                {"headers": '[["Authorization", "Bearer plain-h3ader"]]'},
            )
        # When it is upgraded without a key, it refuses and names what to do
        with pytest.raises(RuntimeError, match="set SETU_SECRET_KEY"):
            migrate.upgrade(database_url)
        # And with a key, both secrets are sealed: the raw row no longer holds them
        sealer = Sealer([Sealer.new_key()])
        migrate.upgrade(database_url, sealer=sealer)
        with engine.connect() as conn:
            raw = str(conn.execute(sa.text("SELECT * FROM subscriptions")).one())
        assert "plain-h3ader" not in raw and "b2xkLXBsYWluLXNlY3JldC0x" not in raw
        # And the store opens them as they were, the secret with an id of its own
        store = MetadataStore(database_url, sealer)
        try:
            sub = store.get_subscription("p", "s")
        finally:
            store.close()
        assert sub.endpoint.headers == (("Authorization", "Bearer plain-h3ader"),)
        assert [(s.id, s.value) for s in sub.signing_secrets] == [
            ("ss_first", "whsec_b2xkLXBsYWluLXNlY3JldC0x")
        ]
        # And a downgrade opens them again for the older code
        migrate.downgrade(database_url, "0002", sealer=sealer)
        with engine.connect() as conn:
            row = conn.execute(sa.text("SELECT signing_secret FROM subscriptions")).one()
        assert row.signing_secret == "whsec_b2xkLXBsYWluLXNlY3JldC0x"
    finally:
        engine.dispose()
