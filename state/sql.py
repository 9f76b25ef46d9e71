"""The SQL engine every metadata table shares (SQLite or PostgreSQL), and its transactions."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import InterfaceError, OperationalError

from setu.errors import DependencyUnavailable

_WRITE = "setu_write"


def make_engine(url: str) -> Engine:
    """An engine for ``url``. SQLite gets foreign keys, WAL, a busy timeout, and write
    transactions that take the write lock up front (``BEGIN IMMEDIATE``), so two writers wait
    for each other instead of failing with "database is locked" half-way through.

    Errors never carry the statement's parameters (``hide_parameters``): they hold sealed
    secrets and key digests, and an error's text ends up in logs (docs/security.md §5)."""
    parsed = sa.make_url(url)
    if not parsed.drivername.startswith("sqlite"):
        connect_args = {"connect_timeout": 5} if parsed.drivername.startswith("postgresql") else {}
        return sa.create_engine(
            url, pool_pre_ping=True, connect_args=connect_args, hide_parameters=True
        )
    if parsed.database and parsed.database != ":memory:":
        Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
    engine = sa.create_engine(url, connect_args={"timeout": 30}, hide_parameters=True)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Let SQLAlchemy, not the sqlite3 module, decide when transactions begin.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA busy_timeout=30000")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        write = conn.get_execution_options().get(_WRITE, False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")

    return engine


@contextmanager
def transaction(engine: Engine, *, write: bool = False) -> Iterator[Connection]:
    """One transaction; a database that does not answer is DependencyUnavailable."""
    try:
        with engine.connect() as conn:
            if write:
                conn.execution_options(**write_options())
            with conn.begin():
                yield conn
    except (OperationalError, InterfaceError) as exc:
        raise DependencyUnavailable(f"metadata database: {exc.orig or exc}") from exc


def write_options() -> dict[str, bool]:
    """Execution options marking a connection as a writer (used by migrations too)."""
    return {_WRITE: True}
