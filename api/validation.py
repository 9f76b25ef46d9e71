"""Pure rules of the control plane that a request's shape alone cannot express (docs/design.md §5).

Shapes and numeric bounds live in :mod:`api.schemas` (they show in the OpenAPI); the rules here
relate fields to each other, to the topic, or to the outside world's addresses. Each raises
InvalidInput with a message that names the field.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from urllib.parse import urlsplit

from fastapi import Request
from fastapi.routing import APIRoute

from setu import headers as produce_headers
from setu.addresses import IPAddress, is_private_address, literal_host_is_private
from setu.errors import InvalidInput
from setu.model import Subscription, Topic
from setu.names import shown
from setu.signing import signing_key

# RFC 9110 token characters: what an HTTP header name may contain.
_TOKEN_RE = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
# Visible ASCII, Latin-1 and inner spaces or tabs: no CR, LF or NUL can reach a request.
_VALUE_RE = re.compile(r"[\t\x20-\x7e\x80-\U0010ffff]*")
MAX_HEADER_VALUE_CHARS = 8192

# Headers Setu writes itself on webhook calls, or that belong to the HTTP connection.
_ENDPOINT_RESERVED = frozenset(
    {
        "host",
        "content-length",
        "transfer-encoding",
        "connection",
        "webhook-id",
        "webhook-timestamp",
        "webhook-signature",
    }
)


def check_header(where: str, name: str, value: str) -> None:
    """A header that may go on an HTTP request as it is."""
    # fullmatch: "$" would also match before a final newline, letting a "\n" through.
    if not _TOKEN_RE.fullmatch(name):
        raise InvalidInput(f"{where}: {name!r} is not a valid HTTP header name")
    if len(value) > MAX_HEADER_VALUE_CHARS or not _VALUE_RE.fullmatch(value):
        raise InvalidInput(f"{where}: value of {name!r} has control characters or is too long")


def check_endpoint_headers(pairs: Iterable[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    """Fixed headers of a subscription's webhook calls; Setu's own names are refused."""
    out = []
    for name, value in pairs:
        check_header("endpoint.headers", name, value)
        canonical = produce_headers.canonical(name)
        if name.lower() in _ENDPOINT_RESERVED or canonical in produce_headers.IDENTITY_HEADERS:
            raise InvalidInput(f"endpoint.headers: {name!r} is set by Setu")
        if canonical in produce_headers.RESERVED_HEADERS:
            raise InvalidInput(f"endpoint.headers: {name!r} is set by Setu")
        out.append((name, value))
    return tuple(out)


def endpoint_host(url: str, field: str = "endpoint.url") -> str:
    """The host of a webhook URL, after checking the URL's form: http(s), a host, no
    credentials (they belong in endpoint headers, where GET does not echo them in a URL), no
    space or control character (it would go out inside the request line), a host name DNS
    can carry."""
    if any(c <= " " or c == "\x7f" for c in url):
        raise InvalidInput(f"{field} may not contain spaces or control characters")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise InvalidInput(f"{field}: {exc}") from None
    if parts.scheme not in ("http", "https"):
        raise InvalidInput(f"{field} must start with http:// or https://")
    if not parts.hostname:
        raise InvalidInput(f"{field} has no host")
    if parts.username is not None or parts.password is not None:
        raise InvalidInput(f"{field} may not carry credentials; use endpoint.headers")
    if port == 0:
        raise InvalidInput(f"{field} has port 0")
    host = parts.hostname
    try:
        encoded = host.encode("idna")
    except UnicodeError as exc:  # a label over 63 characters, say
        raise InvalidInput(f"{field} host {host[:80]!r} is not a valid host name: {exc}") from None
    if len(encoded) > 253:
        raise InvalidInput(f"{field} host is longer than 253 characters")
    return host


def endpoint_origin(url: str) -> tuple[str, str, int]:
    """(scheme, host, port) of a checked webhook URL, the port filled in from the scheme and
    the host in lower case: two URLs with one origin reach the same server."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    return scheme, (parts.hostname or "").lower(), parts.port or (443 if scheme == "https" else 80)


async def known_query_only(request: Request) -> None:
    """Refuses query parameters the route does not take (a typo such as ``?limt=5`` must not
    be silently ignored), and one given twice (which of the two would count?)."""
    route = request.scope.get("route")
    if not isinstance(route, APIRoute) or not request.query_params:
        return
    # What the OpenAPI document says the operation takes (built once, then cached by FastAPI).
    documented = request.app.openapi()["paths"].get(route.path_format, {})
    operation = documented.get(request.method.lower(), {})  # {}: /metrics, /docs take none
    known = {p["name"] for p in operation.get("parameters", ()) if p["in"] == "query"}
    unknown = sorted(set(request.query_params) - known)
    if unknown:
        allowed = ", ".join(sorted(known)) or "none"
        raise InvalidInput(
            f"unknown query parameter(s) {', '.join(shown(u, 40) for u in unknown[:5])}; "
            f"this route takes: {allowed}"
        )
    repeated = sorted({k for k in request.query_params if len(request.query_params.getlist(k)) > 1})
    if repeated:
        raise InvalidInput(f"query parameter(s) given more than once: {', '.join(repeated)}")


def refuse_private(
    host: str, resolved: Iterable[IPAddress], allow_private: bool, field: str = "endpoint.url"
) -> None:
    """Refuses a webhook host that is, or resolves to, a private or loopback address."""
    if allow_private:
        return
    private = literal_host_is_private(host) or any(is_private_address(a) for a in resolved)
    if private:
        raise InvalidInput(
            f"{field} host {host!r} is private or loopback; "
            "set SETU_ALLOW_PRIVATE_ENDPOINTS=true to allow such endpoints"
        )


def check_grouping(grouped: bool, topic: Topic) -> None:
    if grouped and not topic.grouped:
        raise InvalidInput(
            f"a grouped subscription needs a grouped topic; topic {topic.name!r} is ungrouped"
        )


def check_update(current: Subscription, new: Subscription) -> None:
    """A PUT may change how a subscription delivers, not what it reads or its ordering."""
    if new.topic != current.topic:
        raise InvalidInput("topic of a subscription cannot change; create another subscription")
    if new.grouped != current.grouped:
        raise InvalidInput("grouped cannot change; create another subscription")


# A signing key shorter than this is guessable: "whsec_" alone gave an empty HMAC key.
MIN_SIGNING_KEY_BYTES = 16


def check_signing_secret(secret: str) -> str:
    """A signing secret whose key holds at least 128 bits (``whsec_`` + base64, or the text
    itself), with no control characters."""
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in secret):
        raise InvalidInput("signing_secret must not contain control characters")
    if len(signing_key(secret)) < MIN_SIGNING_KEY_BYTES:
        raise InvalidInput(
            f"signing_secret must hold a key of at least {MIN_SIGNING_KEY_BYTES} bytes (128 "
            "bits): whsec_ followed by base64 of at least 16 random bytes"
        )
    return secret
