"""Who may do what: API keys' roles and the permission each route needs (docs/security.md).

Pure: the API's authenticator (``api.auth``) finds the caller's :class:`Principal` and asks
:func:`check` before a route runs. Roles are those of docs/design.md §8:

============  ==================================================================
``admin``     every project: projects, keys of any project, and all below
``owner``     one project: topics, subscriptions, keys, operator actions; produce
``operator``  one project: read everything; lifecycle, seek, DLQ browse, unsideline
``producer``  one project (optionally listed topics): produce, read ``producers/{id}``
``viewer``    one project: configs, status and group state; no message bodies
============  ==================================================================
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from enum import StrEnum

from setu.errors import Forbidden


class Role(StrEnum):
    ADMIN = "admin"
    OWNER = "owner"
    OPERATOR = "operator"
    PRODUCER = "producer"
    VIEWER = "viewer"


class Permission(StrEnum):
    """What a route needs. Every route declares exactly one (``api.auth.allow``)."""

    # Any valid key (what it answers is limited to the key's scope, e.g. the project list).
    SIGNED_IN = "signed_in"
    # Create and delete projects; keys of any project.
    ADMIN = "admin"
    # Topics, subscriptions and keys of the project.
    MANAGE = "manage"
    # Lifecycle, seek, unsideline.
    OPERATE = "operate"
    # Message bodies: the DLQ browser.
    READ_BODIES = "read_bodies"
    # The project's keys (names, roles, expiry; never a secret).
    READ_KEYS = "read_keys"
    # Configs, status and group state.
    READ = "read"
    # Where a producer stands (``producers/{id}``).
    READ_PRODUCER = "read_producer"
    # Produce and batch produce (a producer key with a topic list: those topics only).
    PRODUCE = "produce"


_GRANTS: dict[Role, frozenset[Permission]] = {
    Role.ADMIN: frozenset(Permission),
    Role.OWNER: frozenset(Permission) - {Permission.ADMIN},
    Role.OPERATOR: frozenset(
        {
            Permission.SIGNED_IN,
            Permission.OPERATE,
            Permission.READ_BODIES,
            Permission.READ_KEYS,
            Permission.READ,
            Permission.READ_PRODUCER,
        }
    ),
    Role.PRODUCER: frozenset({Permission.SIGNED_IN, Permission.PRODUCE, Permission.READ_PRODUCER}),
    Role.VIEWER: frozenset({Permission.SIGNED_IN, Permission.READ, Permission.READ_PRODUCER}),
}


def grants(role: Role) -> frozenset[Permission]:
    return _GRANTS[role]


@dataclass(frozen=True, slots=True)
class Principal:
    """An authenticated caller: its key's id and name, role and scope. ``project`` is None
    only for admin keys; ``topics`` None means every topic of the project."""

    key_id: str
    name: str
    role: Role
    project: str | None
    topics: frozenset[str] | None = None

    def sees(self, project: str) -> bool:
        """Whether ``project`` is in the key's scope."""
        return self.role is Role.ADMIN or self.project == project


def check(
    who: Principal, need: Permission, project: str | None = None, topic: str | None = None
) -> None:
    """Raises :class:`Forbidden` unless ``who`` may do what needs ``need`` on ``project``
    (and, for produce, ``topic``)."""
    check_role(who, need)
    if project is not None and not who.sees(project):
        raise Forbidden(f"this key is not for project {project!r}")
    if need is Permission.PRODUCE and who.topics is not None and topic not in who.topics:
        raise Forbidden(f"this key may not produce to topic {topic!r}")


def check_role(who: Principal, need: Permission) -> None:
    """Raises :class:`Forbidden` unless ``who``'s role grants ``need`` somewhere: for a caller
    that names its project and topic later (a streaming session's HELLO; each NOTIFY then
    passes :func:`check` for its stream)."""
    if need not in _GRANTS[who.role]:
        raise Forbidden(f"a {who.role} key may not do this")


# A key as the caller holds it: "setu_" + 16 hex characters (its public id) + "_" + the secret
# (32 random bytes, base64url). Only a SHA-256 digest of the secret is stored: the secret has
# 256 bits of entropy, so a slow password hash would add cost and no safety.
TOKEN_PREFIX = "setu_"
_ID_HEX = 16


@dataclass(frozen=True, slots=True)
class ApiKey:
    """A stored key: everything but its secret, which only ``digest`` stands for."""

    key_id: str
    name: str
    role: Role
    project: str | None
    topics: tuple[str, ...] | None
    digest: str
    created_at_ms: int
    expires_at_ms: int | None = None
    last_used_at_ms: int | None = None
    revoked_at_ms: int | None = None

    def principal(self) -> Principal:
        topics = frozenset(self.topics) if self.topics is not None else None
        return Principal(self.key_id, self.name, self.role, self.project, topics)

    def usable(self, now_ms: int) -> bool:
        """Neither revoked nor expired at ``now_ms``."""
        if self.revoked_at_ms is not None:
            return False
        return self.expires_at_ms is None or now_ms < self.expires_at_ms


def new_token() -> tuple[str, str]:
    """A fresh key: its id and the token the caller is shown once."""
    key_id = secrets.token_hex(_ID_HEX // 2)
    return key_id, f"{TOKEN_PREFIX}{key_id}_{secrets.token_urlsafe(32)}"


def key_id_of(token: str) -> str | None:
    """The public id of a well-formed token, else None."""
    end = len(TOKEN_PREFIX) + _ID_HEX
    if not token.startswith(TOKEN_PREFIX) or len(token) < end + 2 or token[end] != "_":
        return None
    key_id = token[len(TOKEN_PREFIX) : end]
    return key_id if _is_hex(key_id) else None


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def same_digest(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode(), b.encode())


def _is_hex(text: str) -> bool:
    return all(c in "0123456789abcdef" for c in text)
