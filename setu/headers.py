"""Produce-API header rules (docs/design.md §2), as one pure function over a header mapping.

Header names are case-insensitive and ``X_`` / ``X-`` spellings are equivalent, because common
proxies drop names with underscores.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from setu.errors import InvalidInput

MAX_ID_CHARS = 100
MAX_SEQUENCE = 2**63 - 1

MESSAGE_ID = "X_MESSAGE_ID"
GROUP_ID = "X_GROUP_ID"
PRODUCER_ID = "X_PRODUCER_ID"
SEQUENCE_ID = "X_SEQUENCE_ID"
DELIVERY_ATTEMPT = "X_DELIVERY_ATTEMPT"
# Delivery at a chosen time (docs/scheduling.md): epoch ms, or a delay in ms from produce.
DELIVER_AT = "X_DELIVER_AT"
DELIVER_AFTER = "X_DELIVER_AFTER_MS"
REPLAY_ID = "X_REPLAY_ID"
IDENTITY_HEADERS = frozenset({MESSAGE_ID, GROUP_ID, PRODUCER_ID, SEQUENCE_ID})
# Set by Setu on webhook calls; a producer may not supply them.
RESERVED_HEADERS = frozenset({DELIVERY_ATTEMPT, REPLAY_ID})


@dataclass(frozen=True, slots=True)
class ProduceHeaders:
    """The identity of one produced message plus the producer's own ``X_*`` headers."""

    message_id: str
    group_id: str | None
    producer_id: str | None
    sequence_id: int | None
    extra: tuple[tuple[str, str], ...]


_CONTROL = re.compile("[\x00-\x1f\x7f]")


def canonical(name: str) -> str:
    """``x-group-id`` and ``X_GROUP_ID`` both become ``X_GROUP_ID``."""
    return name.upper().replace("-", "_")


def check_id(kind: str, value: str | None, *, required: bool) -> str | None:
    """Return a valid 1..100-char id, None when absent and optional, else raise InvalidInput."""
    if value is None or value == "":
        if required:
            raise InvalidInput(f"{kind} is required")
        return None
    if len(value) > MAX_ID_CHARS:
        raise InvalidInput(f"{kind} must be at most {MAX_ID_CHARS} characters")
    if _CONTROL.search(value):
        # Ids travel as header values on every webhook call: a CR or LF would start a header
        # of the producer's choosing there.
        raise InvalidInput(f"{kind} must not contain control characters")
    return value


def check_sequence(value: str | int | None, name: str = SEQUENCE_ID) -> int | None:
    """Return the sequence id as an int in 0..2^63-1, or raise InvalidInput (naming ``name``)."""
    if value is None or value == "":
        return None
    wrong = InvalidInput(f"{name} must be an integer 0..{MAX_SEQUENCE}")
    if isinstance(value, bool):
        raise wrong
    # Plain ASCII digits only: int() also takes "1_000", " 7 " and non-ASCII digits.
    if isinstance(value, str) and not (value.isascii() and value.isdigit()):
        raise wrong
    try:
        number = int(value)
    except ValueError:
        raise wrong from None
    if not 0 <= number <= MAX_SEQUENCE:
        raise wrong
    return number


# How errors name the identity of a message: its headers (single produce), or the fields of a
# batch message.
HEADER_NAMES = (MESSAGE_ID, GROUP_ID, PRODUCER_ID, SEQUENCE_ID)
FIELD_NAMES = ("message_id", "group_id", "producer_id", "sequence_id")


def check_identity(
    message_id: str | None,
    group_id: str | None,
    producer_id: str | None,
    sequence_id: str | int | None,
    *,
    grouped: bool,
    names: tuple[str, str, str, str] = HEADER_NAMES,
) -> tuple[str, str | None, str | None, int | None]:
    """Validate the four identity fields of a message; used by single and batch produce, whose
    errors name them as ``names`` does."""
    mid_name, gid_name, pid_name, seq_name = names
    mid = check_id(mid_name, message_id, required=True)
    assert mid is not None
    gid = check_id(gid_name, group_id, required=grouped)
    pid = check_id(pid_name, producer_id, required=False)
    seq = check_sequence(sequence_id, seq_name)
    if (pid is None) != (seq is None):
        raise InvalidInput(f"{pid_name} and {seq_name} go together: give both or neither")
    return mid, gid, pid, seq


def scheduled_at(
    extra: tuple[tuple[str, str], ...], now_ms: int, limit_ms: int
) -> tuple[int, tuple[tuple[str, str], ...]]:
    """When a message asks to be delivered (:data:`DELIVER_AT` or :data:`DELIVER_AFTER` among
    its ``X_*`` headers; 0: at once, as for a time already past) and its other headers.
    ``limit_ms``: how far ahead its topic allows (0: not at all, an ungrouped topic).
    Raises InvalidInput for a malformed, doubled or too distant time."""
    if not extra:
        return 0, extra
    given: dict[str, str] = {}
    kept: list[tuple[str, str]] = []
    for name, value in extra:
        key = canonical(name)
        if key in (DELIVER_AT, DELIVER_AFTER):
            if key in given and given[key] != value:
                raise InvalidInput(f"{key} given twice with different values")
            given[key] = value
        else:
            kept.append((name, value))
    if not given:
        return 0, extra
    if len(given) > 1:
        raise InvalidInput(f"give {DELIVER_AT} or {DELIVER_AFTER}, not both")
    if limit_ms <= 0:
        raise InvalidInput(
            "delivery at a chosen time is for grouped topics (a message waits in its group)"
        )
    ((key, text),) = given.items()
    value = text.strip()
    if not (value.isascii() and value.isdigit()) or len(value) > 15:
        raise InvalidInput(f"{key} must be a whole number of milliseconds")
    at = int(value) if key == DELIVER_AT else now_ms + int(value)
    if at - now_ms > limit_ms:
        raise InvalidInput(f"{key} is more than {limit_ms} ms ahead, this topic's limit")
    return (at if at > now_ms else 0), tuple(kept)


def parse_produce_headers(headers: Iterable[tuple[str, str]], *, grouped: bool) -> ProduceHeaders:
    """Apply docs/design.md §2 to raw HTTP headers; raise InvalidInput on any broken rule.

    Identity headers may appear once each (in either spelling); other ``X_*`` headers are kept
    as given, in order, and everything else (Host, Content-Type, ...) is dropped.
    """
    identity: dict[str, str] = {}
    extra: list[tuple[str, str]] = []
    for name, value in headers:
        key = canonical(name)
        if not key.startswith("X_"):
            continue
        if key in IDENTITY_HEADERS:
            if key in identity and identity[key] != value:
                raise InvalidInput(f"{key} given twice with different values")
            identity[key] = value
        elif key in RESERVED_HEADERS:
            raise InvalidInput(f"{key} is set by Setu and may not be produced")
        else:
            extra.append((name, value))
    mid, gid, pid, seq = check_identity(
        identity.get(MESSAGE_ID),
        identity.get(GROUP_ID),
        identity.get(PRODUCER_ID),
        identity.get(SEQUENCE_ID),
        grouped=grouped,
    )
    return ProduceHeaders(mid, gid, pid, seq, tuple(extra))
