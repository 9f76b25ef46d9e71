"""Subscription policies as values: filters, the circuit breaker's thresholds, the dead-letter
window and where a new subscription starts (docs/policies.md; names of docs/design.md §10).

Pure: parsing from the JSON a client sends (raising InvalidInput with the path of what is
wrong), the JSON a view shows, and a filter's verdict on a message.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from setu import headers as rules
from setu.envelope import Envelope
from setu.errors import InvalidInput

# Bounds that keep a filter cheap to run on every message and small to store.
MAX_FILTER_DEPTH = 8
MAX_FILTER_NODES = 64
MAX_IN_VALUES = 100
MAX_VALUE_CHARS = 1024

MAX_PATH_SEGMENTS = 16
MAX_SEGMENT_CHARS = 128

Op = Literal["equals", "in", "prefix", "exists"]
_OPS: tuple[Op, ...] = ("equals", "in", "prefix", "exists")
BodyOp = Literal["equals", "in", "prefix", "exists", "gt", "gte", "lt", "lte"]
_BODY_OPS: tuple[BodyOp, ...] = ("equals", "in", "prefix", "exists", "gt", "gte", "lt", "lte")
_COMPARE = {
    "gt": lambda a, b: a > b,
    "gte": lambda a, b: a >= b,
    "lt": lambda a, b: a < b,
    "lte": lambda a, b: a <= b,
}
# A JSON scalar as a body test compares it: equal only to a value of the same kind (a number
# to a number, true to true, never 1 to true).
Scalar = str | int | float | bool | None
_ABSENT = object()


@dataclass(frozen=True, slots=True)
class HeaderTest:
    """One test of a header: ``name`` as the client wrote it, ``key`` its canonical form."""

    name: str
    key: str
    op: Op
    values: tuple[str, ...] = ()  # equals and prefix: one value; in: the list
    exists: bool = True  # exists: whether the header must be there or absent

    def holds(self, found: Mapping[str, str]) -> bool:
        value = found.get(self.key)
        if self.op == "exists":
            return (value is not None) == self.exists
        if value is None:
            return False
        if self.op == "prefix":
            return value.startswith(self.values[0])
        return value in self.values  # equals (one value) and in


@dataclass(frozen=True, slots=True)
class BodyTest:
    """One test of a JSON body field: ``path`` as the client wrote it (dotted), ``keys`` its
    segments (a number indexes a list)."""

    path: str
    keys: tuple[str | int, ...]
    op: BodyOp
    values: tuple[Scalar, ...] = ()  # equals, prefix and comparisons: one value; in: the list
    exists: bool = True

    def holds(self, body: object) -> bool:
        """``body``: the parsed JSON body, or :data:`NOT_JSON`."""
        if body is NOT_JSON:
            return False  # a body that is not JSON never matches a body condition
        value = _field(body, self.keys)
        if self.op == "exists":
            return (value is not _ABSENT) == self.exists
        if value is _ABSENT:
            return False
        if self.op == "prefix":
            return isinstance(value, str) and value.startswith(str(self.values[0]))
        if self.op in _COMPARE:
            return _number(value) and _COMPARE[self.op](value, self.values[0])
        return any(_same(value, expected) for expected in self.values)  # equals and in


NOT_JSON = object()


def _field(doc: object, keys: tuple[str | int, ...]) -> object:
    for key in keys:
        if isinstance(key, int) and isinstance(doc, list):
            if not -len(doc) <= key < len(doc):
                return _ABSENT
            doc = doc[key]
        elif isinstance(doc, dict):
            doc = doc.get(str(key), _ABSENT)
            if doc is _ABSENT:
                return _ABSENT
        else:
            return _ABSENT
    return doc


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _same(value: object, expected: Scalar) -> bool:
    if isinstance(expected, bool) or expected is None:
        return value is expected
    if _number(expected):
        return _number(value) and value == expected
    return isinstance(value, str) and value == expected


@dataclass(frozen=True, slots=True)
class AllOf:
    items: tuple[Filter, ...]


@dataclass(frozen=True, slots=True)
class AnyOf:
    items: tuple[Filter, ...]


@dataclass(frozen=True, slots=True)
class NotOf:
    item: Filter


Filter = HeaderTest | BodyTest | AllOf | AnyOf | NotOf


class Seen:
    """What a filter sees of one message: its headers (:func:`message_headers`) and its body,
    parsed as JSON only when a body test first asks."""

    __slots__ = ("_body", "_parsed", "headers")

    def __init__(self, headers: Mapping[str, str], body: bytes = b"") -> None:
        self.headers = headers
        self._body = body
        self._parsed: object = _ABSENT

    def json(self) -> object:
        """The body parsed, or :data:`NOT_JSON`."""
        if self._parsed is _ABSENT:
            try:
                self._parsed = orjson.loads(self._body)
            except orjson.JSONDecodeError:
                self._parsed = NOT_JSON
        return self._parsed


def message_headers(envelope: Envelope) -> dict[str, str]:
    """What a filter sees of a message: its producer ``X_*`` headers and identity, by canonical
    name (the first of a repeated header)."""
    found: dict[str, str] = {}
    for name, value in envelope.headers:
        found.setdefault(rules.canonical(name), value)
    found[rules.MESSAGE_ID] = envelope.message_id
    if envelope.group_id is not None:
        found[rules.GROUP_ID] = envelope.group_id
    if envelope.producer_id is not None:
        found[rules.PRODUCER_ID] = envelope.producer_id
    if envelope.sequence_id is not None:
        found[rules.SEQUENCE_ID] = str(envelope.sequence_id)
    return found


def matches(f: Filter, seen: Seen | Mapping[str, str]) -> bool:
    """Whether a message passes ``f``: ``seen`` is the message, or only its headers (see
    :func:`message_headers`; then it has no body, which is not JSON)."""
    if not isinstance(seen, Seen):
        seen = Seen(seen)
    return _matches(f, seen)


def _matches(f: Filter, seen: Seen) -> bool:
    if isinstance(f, HeaderTest):
        return f.holds(seen.headers)
    if isinstance(f, BodyTest):
        return f.holds(seen.json())
    if isinstance(f, AllOf):
        return all(_matches(item, seen) for item in f.items)
    if isinstance(f, AnyOf):
        return any(_matches(item, seen) for item in f.items)
    return not _matches(f.item, seen)


def accepts(f: Filter | None, envelope: Envelope) -> bool:
    """Whether a subscription with filter ``f`` (None: everything) wants ``envelope``."""
    return f is None or _matches(f, Seen(message_headers(envelope), envelope.body))


def parse_filter(document: object) -> Filter:
    """A filter from its JSON form (docs/design.md §10); raises InvalidInput naming the path."""
    nodes = [0]
    return _parse(document, "filter", 1, nodes)


def _parse(doc: object, path: str, depth: int, nodes: list[int]) -> Filter:
    nodes[0] += 1
    if nodes[0] > MAX_FILTER_NODES:
        raise InvalidInput(f"filter: more than {MAX_FILTER_NODES} tests and combinations")
    if depth > MAX_FILTER_DEPTH:
        raise InvalidInput(f"{path}: filters nest at most {MAX_FILTER_DEPTH} deep")
    if not isinstance(doc, dict):
        raise InvalidInput(f"{path}: must be an object")
    combinators = [k for k in ("all", "any", "not") if k in doc]
    if combinators:
        if len(doc) != 1:
            raise InvalidInput(f"{path}: {combinators[0]!r} takes no other fields")
        key = combinators[0]
        inner = doc[key]
        if key == "not":
            return NotOf(_parse(inner, f"{path}.not", depth + 1, nodes))
        if not isinstance(inner, list) or not inner:
            raise InvalidInput(f"{path}.{key}: must be a non-empty list of filters")
        items = tuple(
            _parse(item, f"{path}.{key}[{i}]", depth + 1, nodes) for i, item in enumerate(inner)
        )
        return AllOf(items) if key == "all" else AnyOf(items)
    if "body" in doc:
        return _body_test(doc, path)
    return _header_test(doc, path)


def _body_test(doc: dict[str, Any], path: str) -> BodyTest:
    field = doc.get("body")
    if not isinstance(field, str) or not field:
        raise InvalidInput(f"{path}.body: must be a dotted path of a JSON field, like order.total")
    segments = field.split(".")
    if len(segments) > MAX_PATH_SEGMENTS or any(
        not seg or len(seg) > MAX_SEGMENT_CHARS for seg in segments
    ):
        raise InvalidInput(
            f"{path}.body: {MAX_PATH_SEGMENTS} non-empty segments of at most "
            f"{MAX_SEGMENT_CHARS} characters, joined by dots"
        )
    keys = tuple(int(seg) if seg.isdigit() else seg for seg in segments)
    op, value = _operator(doc, path, "body", _BODY_OPS, ", ".join(map(repr, _BODY_OPS)))
    if op == "exists":
        return BodyTest(field, keys, op, exists=_flag(value, path))
    if op == "in":
        listed = _listed(value, path, "JSON values")
        return BodyTest(field, keys, op, tuple(_scalar(v, f"{path}.in") for v in listed))
    if op == "prefix":
        return BodyTest(field, keys, op, (_value(value, f"{path}.prefix"),))
    if op in _COMPARE:
        if not _number(value):
            raise InvalidInput(f"{path}.{op}: must be a number")
        return BodyTest(field, keys, op, (value,))
    return BodyTest(field, keys, op, (_scalar(value, f"{path}.equals"),))


def _scalar(value: object, path: str) -> Scalar:
    if isinstance(value, str):
        return _value(value, path)
    if value is None or isinstance(value, bool | int | float):
        return value
    raise InvalidInput(f"{path}: values are strings, numbers, true, false or null")


def _header_test(doc: dict[str, Any], path: str) -> HeaderTest:
    name = doc.get("header")
    if not isinstance(name, str) or not name:
        raise InvalidInput(f'{path}: needs "header" or "body" (or one of "all", "any", "not")')
    key = rules.canonical(name)
    if not key.startswith("X_") or key == "X_":
        raise InvalidInput(f"{path}.header: {name!r} is not an X_* header")
    if key in rules.RESERVED_HEADERS:
        raise InvalidInput(f"{path}.header: {name!r} is set by Setu, not by producers")
    op, value = _operator(doc, path, "header", _OPS, '"equals", "in", "prefix", "exists"')
    if op == "exists":
        return HeaderTest(name, key, op, exists=_flag(value, path))
    if op == "in":
        listed = _listed(value, path, "strings")
        return HeaderTest(name, key, op, tuple(_value(v, f"{path}.in") for v in listed))
    return HeaderTest(name, key, op, (_value(value, f"{path}.{op}"),))


def _operator(
    doc: dict[str, Any], path: str, subject: str, ops: tuple[Any, ...], named: str
) -> tuple[Any, Any]:
    """A test's one operator and its value; any other field is refused."""
    unknown = sorted(set(doc) - {subject, *ops})
    if unknown:
        raise InvalidInput(f"{path}: unknown fields {unknown}")
    given = [op for op in ops if op in doc]
    if len(given) != 1:
        raise InvalidInput(f"{path}: give exactly one of {named}")
    return given[0], doc[given[0]]


def _flag(value: object, path: str) -> bool:
    if not isinstance(value, bool):
        raise InvalidInput(f"{path}.exists: must be true or false")
    return value


def _listed(value: object, path: str, what: str) -> list[Any]:
    if not isinstance(value, list) or not value or len(value) > MAX_IN_VALUES:
        raise InvalidInput(f"{path}.in: must be a list of 1 to {MAX_IN_VALUES} {what}")
    return value


def _value(value: object, path: str) -> str:
    if not isinstance(value, str):
        raise InvalidInput(f"{path}: values are strings")
    if len(value) > MAX_VALUE_CHARS:
        raise InvalidInput(f"{path}: a value has at most {MAX_VALUE_CHARS} characters")
    return value


def filter_json(f: Filter) -> dict[str, Any]:
    """The JSON form of ``f``, as a client wrote it (names as given)."""
    if isinstance(f, HeaderTest):
        if f.op == "exists":
            return {"header": f.name, "exists": f.exists}
        if f.op == "in":
            return {"header": f.name, "in": list(f.values)}
        return {"header": f.name, f.op: f.values[0]}
    if isinstance(f, BodyTest):
        if f.op == "exists":
            return {"body": f.path, "exists": f.exists}
        if f.op == "in":
            return {"body": f.path, "in": list(f.values)}
        return {"body": f.path, f.op: f.values[0]}
    if isinstance(f, AllOf):
        return {"all": [filter_json(item) for item in f.items]}
    if isinstance(f, AnyOf):
        return {"any": [filter_json(item) for item in f.items]}
    return {"not": filter_json(f.item)}


@dataclass(frozen=True, slots=True)
class BreakerPolicy:
    """When a subscription's circuit breaker opens (docs/policies.md §2): more than
    ``failure_ratio`` of the calls of the last ``window_s`` failed, over at least
    ``min_calls`` calls; it stays open ``open_s`` before a probe call."""

    failure_ratio: float = 0.5
    min_calls: int = 20
    window_s: int = 30
    open_s: int = 30


@dataclass(frozen=True, slots=True)
class DeadLetterWindow:
    """More than ``threshold`` of the last ``size`` finished messages dead-lettered pauses
    the subscription (docs/policies.md §3)."""

    size: int = 100
    threshold: int = 50


@dataclass(frozen=True, slots=True)
class StartFrom:
    """Where a new subscription starts: ``earliest``, ``latest`` or ``timestamp``."""

    kind: Literal["earliest", "latest", "timestamp"] = "earliest"
    timestamp_ms: int | None = None

    def json(self) -> str | dict[str, int]:
        if self.kind == "timestamp":
            assert self.timestamp_ms is not None
            return {"timestamp_ms": self.timestamp_ms}
        return self.kind

    def seek_to_ms(self, created_at_ms: int) -> int | None:
        """The main-log time a new subscription is sought to (None: from the beginning)."""
        if self.kind == "latest":
            return created_at_ms
        return self.timestamp_ms


def parse_start_from(document: object) -> StartFrom:
    if document in ("earliest", "latest"):
        return StartFrom(document)
    if isinstance(document, dict) and set(document) == {"timestamp_ms"}:
        t = document["timestamp_ms"]
        if isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 2**63:
            return StartFrom("timestamp", t)
    raise InvalidInput('start_from: "earliest", "latest" or {"timestamp_ms": T} (T >= 0)')


DEFAULT_AUTO_PAUSE_AFTER_S = 86_400


@dataclass(frozen=True, slots=True)
class Policies:
    """A subscription's policies (docs/design.md §10). None turns a policy off."""

    filter: Filter | None = None
    circuit_breaker: BreakerPolicy | None = BreakerPolicy()
    auto_pause_after_s: int | None = DEFAULT_AUTO_PAUSE_AFTER_S
    dead_letter_window: DeadLetterWindow | None = None
    start_from: StartFrom = StartFrom()

    def json(self) -> dict[str, Any]:
        """The fields as a subscription's body and view spell them."""
        breaker, window = self.circuit_breaker, self.dead_letter_window
        return {
            "filter": None if self.filter is None else filter_json(self.filter),
            "circuit_breaker": None if breaker is None else dataclasses.asdict(breaker),
            "auto_pause_after_s": self.auto_pause_after_s,
            "dead_letter_window": None if window is None else dataclasses.asdict(window),
            "start_from": self.start_from.json(),
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any] | None) -> Policies:
        """Policies from :meth:`json`'s form (as stored; a field left out takes its default)."""
        if not doc:
            return cls()
        default = _DEFAULTS
        # Defaults made once: built here, they were a tenth of an idle worker's time at 1,000
        # subscriptions (it lists every subscription every 2 s).
        breaker = doc.get("circuit_breaker", _DEFAULT_BREAKER)
        window = doc.get("dead_letter_window")
        return cls(
            filter=None if doc.get("filter") is None else parse_filter(doc["filter"]),
            circuit_breaker=None if breaker is None else BreakerPolicy(**breaker),
            auto_pause_after_s=doc.get("auto_pause_after_s", default.auto_pause_after_s),
            dead_letter_window=None if window is None else DeadLetterWindow(**window),
            start_from=parse_start_from(doc.get("start_from", "earliest")),
        )


_DEFAULTS = Policies()
_DEFAULT_BREAKER: Mapping[str, Any] = dataclasses.asdict(BreakerPolicy())
