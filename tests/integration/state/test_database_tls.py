"""``sslmode`` and the other libpq parameters ride on the database URL's query, unchanged, to
every connection Setu makes (docs/security.md §8).

The test server speaks no TLS, so libpq refusing it under ``sslmode=require`` proves the
parameter reached libpq on each path: migrations and the metadata store.
"""

from __future__ import annotations

import pytest
from sqlalchemy.exc import OperationalError

from setu.errors import DependencyUnavailable
from state import migrate
from state.metadata import MetadataStore
from state.sealing import Sealer

REFUSED = "server does not support SSL, but SSL was required"


def test_sslmode_require_reaches_libpq_on_every_path(pg_url: str) -> None:
    required = f"{pg_url}?sslmode=require"
    with pytest.raises(OperationalError, match=REFUSED):
        migrate.upgrade(required)
    with pytest.raises(OperationalError, match=REFUSED):
        migrate.current(required)
    store = MetadataStore(required, Sealer([Sealer.new_key()]))
    try:
        with pytest.raises(DependencyUnavailable, match=REFUSED):
            store.ping()
    finally:
        store.close()


def test_sslmode_disable_connects_in_clear(pg_url: str) -> None:
    allowed = f"{pg_url}?sslmode=disable&application_name=setu-test"
    migrate.upgrade(allowed)
    migrate.require_head(allowed)
    store = MetadataStore(allowed, Sealer([Sealer.new_key()]))
    try:
        store.ping()
        assert store.list_projects() == []
    finally:
        store.close()
