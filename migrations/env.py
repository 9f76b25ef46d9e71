"""Alembic environment: runs migrations on the connection given by ``state.migrate``.

Without one (plain ``alembic`` use), it opens the URL from the config's ``sqlalchemy.url``;
offline mode (``--sql``) renders the SQL for a DBA to apply by hand.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy.engine import Connection

from state.schema import metadata
from state.sql import make_engine, write_options


def _migrate(conn: Connection) -> None:
    context.configure(
        connection=conn,
        target_metadata=metadata,
        # SQLite cannot ALTER most things; batch mode copies the table instead.
        render_as_batch=conn.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_offline() -> None:
    context.configure(
        url=context.config.get_main_option("sqlalchemy.url"),
        target_metadata=metadata,
        literal_binds=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    given = context.config.attributes.get("connection")
    if given is not None:
        _migrate(given)
        return
    url = context.config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError("set sqlalchemy.url or pass a connection in config.attributes")
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            conn.execution_options(**write_options())
            _migrate(conn)
            conn.commit()
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
