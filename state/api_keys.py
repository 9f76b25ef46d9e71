"""API keys in the metadata database (docs/security.md): one row per key, its secret stored
only as a digest (:mod:`setu.access`).

Contract (the same tests on SQLite and PostgreSQL): :meth:`KeyStore.create` stores a new key;
:meth:`KeyStore.find` returns a key by id whatever its state (revoked and expired keys too, so
the caller can tell them apart); :meth:`KeyStore.list` shows the keys not revoked, of one
project or of all; :meth:`KeyStore.revoke` marks a key revoked once (NotFound for an unknown
key, or one of another project when ``project`` is given); deleting a project revokes its keys.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine, Row

from setu.access import ApiKey, Role
from setu.clock import now_ms
from setu.errors import NotFound
from state.schema import api_keys
from state.sql import transaction


def _key(row: Row[Any]) -> ApiKey:
    return ApiKey(
        key_id=row.key_id,
        name=row.name,
        role=Role(row.role),
        project=row.project,
        topics=tuple(row.topics) if row.topics is not None else None,
        digest=row.digest,
        created_at_ms=row.created_at_ms,
        expires_at_ms=row.expires_at_ms,
        last_used_at_ms=row.last_used_at_ms,
        revoked_at_ms=row.revoked_at_ms,
    )


def revoke_project_keys(conn: Connection, project: str) -> None:
    """Revokes every key of ``project`` (in the caller's transaction: the project goes)."""
    conn.execute(
        sa.update(api_keys)
        .where(api_keys.c.project == project, api_keys.c.revoked_at_ms.is_(None))
        .values(revoked_at_ms=now_ms())
    )


class KeyStore:
    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def create(self, key: ApiKey) -> ApiKey:
        values = {
            "key_id": key.key_id,
            "name": key.name,
            "role": key.role.value,
            "project": key.project,
            "topics": list(key.topics) if key.topics is not None else None,
            "digest": key.digest,
            "created_at_ms": key.created_at_ms,
            "expires_at_ms": key.expires_at_ms,
            "last_used_at_ms": None,
            "revoked_at_ms": None,
        }
        with transaction(self._engine, write=True) as conn:
            conn.execute(sa.insert(api_keys).values(values))
        return key

    def find(self, key_id: str) -> ApiKey | None:
        with transaction(self._engine) as conn:
            row = conn.execute(sa.select(api_keys).where(api_keys.c.key_id == key_id)).first()
        return _key(row) if row is not None else None

    def ids(self) -> frozenset[str]:
        """The id of every key ever made, revoked ones too (one narrow query: the API asks it
        instead of a lookup per unknown id, docs/security.md §1)."""
        with transaction(self._engine) as conn:
            return frozenset(conn.execute(sa.select(api_keys.c.key_id)).scalars())

    def list(self, project: str | None = None) -> list[ApiKey]:
        query = sa.select(api_keys).where(api_keys.c.revoked_at_ms.is_(None))
        if project is not None:
            query = query.where(api_keys.c.project == project)
        with transaction(self._engine) as conn:
            rows = conn.execute(query.order_by(api_keys.c.created_at_ms, api_keys.c.key_id))
            return [_key(r) for r in rows]

    def revoke(self, key_id: str, project: str | None = None) -> ApiKey:
        """Revokes the key; NotFound when there is no such key not yet revoked (in
        ``project``, when given)."""
        where = [api_keys.c.key_id == key_id, api_keys.c.revoked_at_ms.is_(None)]
        if project is not None:
            where.append(api_keys.c.project == project)
        with transaction(self._engine, write=True) as conn:
            done = conn.execute(sa.update(api_keys).where(*where).values(revoked_at_ms=now_ms()))
            if done.rowcount != 1:
                raise NotFound(f"key {key_id!r} not found")
            row = conn.execute(sa.select(api_keys).where(api_keys.c.key_id == key_id)).one()
        return _key(row)

    def touch(self, key_id: str, at_ms: int) -> None:
        """Records that the key was used at ``at_ms`` (its last-used time only grows)."""
        with transaction(self._engine, write=True) as conn:
            conn.execute(
                sa.update(api_keys)
                .where(
                    api_keys.c.key_id == key_id,
                    sa.or_(
                        api_keys.c.last_used_at_ms.is_(None),
                        api_keys.c.last_used_at_ms < at_ms,
                    ),
                )
                .values(last_used_at_ms=at_ms)
            )
