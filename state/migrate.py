"""Schema migrations of the metadata store, run through Alembic without an ini file.

``setu migrate`` calls :func:`upgrade`; the API refuses to start on a database older than
:func:`head` (see :func:`require_head`), so a forgotten migration fails loudly at startup
rather than as a missing column on some later request.
"""

from __future__ import annotations

import logging

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError

from setu.errors import DependencyUnavailable
from state.sealing import Sealer
from state.sql import make_engine, write_options

# The revisions, named as a package resource that Alembic finds itself: state/ imports no
# package above it (the revisions import state.schema).
SCRIPT_LOCATION = "migrations:."

log = logging.getLogger(__name__)


def _config() -> Config:
    config = Config()
    config.set_main_option("script_location", SCRIPT_LOCATION)
    return config


def _run(url: str, action: str, revision: str, sealer: Sealer | None) -> None:
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            conn.execution_options(**write_options())
            config = _config()
            # env.py runs on this connection instead of opening its own.
            config.attributes["connection"] = conn
            # Revisions that seal or open secrets (0003) take the key from here.
            config.attributes["sealer"] = sealer
            if action == "upgrade":
                command.upgrade(config, revision)
            else:
                command.downgrade(config, revision)
            conn.commit()
    finally:
        engine.dispose()


def upgrade(url: str, revision: str = "head", *, sealer: Sealer | None = None) -> None:
    """Migrates the database at ``url`` up to ``revision`` (default: the newest). ``sealer``
    is needed only when stored secrets must be sealed on the way."""
    _run(url, "upgrade", revision, sealer)


def downgrade(url: str, revision: str, *, sealer: Sealer | None = None) -> None:
    """Migrates the database at ``url`` down to ``revision`` (``base`` empties it)."""
    _run(url, "downgrade", revision, sealer)


def head() -> str:
    """The newest revision this code knows."""
    heads = ScriptDirectory.from_config(_config()).get_heads()
    if len(heads) != 1:
        raise RuntimeError(f"migrations must have one head, found {heads}")
    return heads[0]


def current(url: str) -> str | None:
    """The revision the database at ``url`` is at; None for an empty database."""
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()


def require_head(url: str) -> None:
    """Raises DependencyUnavailable unless the database is migrated to :func:`head`, or to a
    revision this code does not know: a newer release's, whose pre-upgrade migration ran
    while this release's pods still serve (or one of them restarts). Migrations only add
    (columns with defaults, tables), so the code of the release before keeps working on the
    migrated database until its pods are replaced (docs/design.md, "Upgrades")."""
    at, want = current(url), head()
    if at == want:
        return
    if at is not None and not _known(at):
        log.warning(
            "metadata database is at revision %s, newer than this code's %s: running on it "
            "(an upgrade in progress)",
            at,
            want,
        )
        return
    raise DependencyUnavailable(
        f"metadata database is at revision {at or 'none'}, this code needs {want}: "
        "run `setu migrate`"
    )


def _known(revision: str) -> bool:
    """Whether ``revision`` is one of this code's migrations."""
    try:
        return ScriptDirectory.from_config(_config()).get_revision(revision) is not None
    except CommandError:  # Alembic's "Can't locate revision"
        return False
