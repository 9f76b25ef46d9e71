"""How webhook calls leave Setu (docs/security.md §4, "Protected endpoints"): the egress
proxies they are tunnelled through (the tunnel itself is delivery/egress.py), and the TLS
context a subscription's settings make.

Python's ``ssl`` loads a certificate chain only from a file, so :func:`tls_context` writes the
client certificate and key to a file of a private directory (mode 0600), loads it, and removes
it at once."""

from __future__ import annotations

import base64
import os
import ssl
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlsplit

from setu.model import EndpointTls


@dataclass(frozen=True, slots=True)
class Proxy:
    """An HTTP proxy: where it listens and the ``Proxy-Authorization`` its URL's user info
    gives (a secret, kept out of the repr)."""

    host: str
    port: int
    authorization: str | None = field(default=None, repr=False)

    @classmethod
    def parse(cls, url: str) -> Proxy:
        """``http://[user:password@]host[:port]``; the port defaults to 3128."""
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError("a proxy URL is http://[user:password@]host[:port]")
        if parts.path not in ("", "/") or parts.query or parts.fragment:
            raise ValueError("a proxy URL has no path, query or fragment")
        authorization = None
        if parts.username is not None:
            pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
            authorization = "Basic " + base64.b64encode(pair.encode()).decode()
        return cls(parts.hostname, parts.port or 3128, authorization)


class UnknownProxy(ValueError):
    """A subscription names an egress proxy this process was not configured with."""


@dataclass(frozen=True, slots=True)
class Egress:
    """The egress proxies an operator configured (docs/security.md §4): the one every call
    goes through unless its subscription names another (``SETU_EGRESS_PROXY``), and those a
    subscription may name (``SETU_EGRESS_PROXIES``). Subscriptions name proxies, never give
    their addresses: which hosts Setu tunnels through stays the operator's choice."""

    default: Proxy | None = None
    named: Mapping[str, Proxy] = field(default_factory=dict)

    @classmethod
    def parse(cls, default: str | None, named: Mapping[str, str]) -> Egress:
        """From proxy URLs; a bad one raises :class:`ValueError` naming it (never its
        credentials)."""
        proxies = {}
        for name, url in named.items():
            try:
                proxies[name] = Proxy.parse(url)
            except ValueError as exc:
                raise ValueError(f"SETU_EGRESS_PROXIES[{name!r}]: {exc}") from None
        try:
            chosen = None if not default else Proxy.parse(default)
        except ValueError as exc:
            raise ValueError(f"SETU_EGRESS_PROXY: {exc}") from None
        return cls(chosen, proxies)

    def proxy(self, name: str | None) -> Proxy | None:
        """The proxy a subscription's calls go through: the one it names, else the default."""
        if name is None:
            return self.default
        try:
            return self.named[name]
        except KeyError:
            raise UnknownProxy(
                f"egress proxy {name!r} is not configured here (SETU_EGRESS_PROXIES)"
            ) from None


def tls_context(settings: EndpointTls | None) -> ssl.SSLContext:
    """A verifying client context: the system's CAs, plus ``settings``' CA and client
    certificate. Raises :class:`ssl.SSLError` or :class:`ValueError` on PEM that does not
    load (a key that does not match its certificate, say)."""
    context = ssl.create_default_context()
    if settings is None:
        return context
    if settings.ca_certificate:
        context.load_verify_locations(cadata=settings.ca_certificate)
    certificate, key = settings.client_certificate, settings.client_key
    if certificate or key:
        if not (certificate and key):
            raise ValueError("a client certificate goes with its private key")
        with tempfile.TemporaryDirectory(prefix="setu-tls-") as private:
            path = Path(private) / "identity.pem"
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(descriptor, "w") as out:
                out.write(certificate.strip() + "\n" + key.strip() + "\n")
            # No password: an encrypted key fails here instead of OpenSSL asking a terminal.
            context.load_cert_chain(path, password=_no_password)
    return context


def _no_password() -> bytes:
    raise ValueError("an encrypted client_key is not supported: give the key unencrypted")
