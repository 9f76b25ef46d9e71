"""How a subscription reaches a protected endpoint, as the API takes and shows it
(docs/security.md §4, "Protected endpoints"): the TLS settings (client certificate and key, a
CA), OAuth2 client credentials and the egress proxy it names.

Everything is checked when it is given, so a subscription never holds settings its calls
would fail on: PEM that does not parse, a key that is not its certificate's, a certificate that
expired, a token URL that is not https or that resolves inward, a proxy the installation does
not have. Secrets (the client key, the client secret) are write-only: a view says whether one
is held, never what it is.
"""

from __future__ import annotations

import ssl
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes

from api.validation import endpoint_host
from setu.egress import Egress, tls_context
from setu.errors import InvalidInput
from setu.model import Endpoint, EndpointTls, OAuth2Credentials

if TYPE_CHECKING:
    from api.schemas import EndpointBody


def _certificates(field: str, pem: str) -> list[x509.Certificate]:
    try:
        found = x509.load_pem_x509_certificates(pem.encode())
    except ValueError:
        found = []
    if not found:
        raise InvalidInput(f"{field} holds no PEM certificate")
    return found


def certificate_view(pem: str) -> dict[str, Any]:
    """The first certificate of ``pem``: its subject, end of validity and fingerprint."""
    first = x509.load_pem_x509_certificates(pem.encode())[0]
    return {
        "subject": first.subject.rfc4514_string(),
        "not_after_ms": int(first.not_valid_after_utc.timestamp() * 1000),
        "sha256": first.fingerprint(hashes.SHA256()).hex(),
    }


def access_view(endpoint: Endpoint) -> dict[str, Any]:
    """The ``tls``, ``oauth2`` and ``proxy`` fields of an endpoint's view (no secret)."""
    tls, oauth2 = endpoint.tls, endpoint.oauth2
    return {
        "tls": None
        if tls is None
        else {
            "client_certificate": None
            if tls.client_certificate is None
            else certificate_view(tls.client_certificate),
            "has_client_key": tls.client_key is not None,
            "ca_certificate": None
            if tls.ca_certificate is None
            else certificate_view(tls.ca_certificate),
        },
        "oauth2": None
        if oauth2 is None
        else {
            "token_url": oauth2.token_url,
            "client_id": oauth2.client_id,
            "scopes": list(oauth2.scopes),
            "audience": oauth2.audience,
            "client_auth": oauth2.client_auth,
            "has_client_secret": bool(oauth2.client_secret),
        },
        "proxy": endpoint.proxy,
    }


def check_tls(body: EndpointBody, now_ms: int) -> EndpointTls | None:
    """The TLS settings of ``body``, checked: parseable, in date, the key its certificate's."""
    given = body.tls
    if given is None:
        return None
    if (given.client_certificate is None) != (given.client_key is None):
        raise InvalidInput("endpoint.tls: client_certificate and client_key go together")
    if given.client_certificate is None and given.ca_certificate is None:
        raise InvalidInput("endpoint.tls sets neither a client certificate nor a CA")
    for field, pem in (
        ("endpoint.tls.client_certificate", given.client_certificate),
        ("endpoint.tls.ca_certificate", given.ca_certificate),
    ):
        if pem is None:
            continue
        first = _certificates(field, pem)[0]
        if first.not_valid_after_utc.timestamp() * 1000 <= now_ms:
            raise InvalidInput(
                f"{field} expired at {first.not_valid_after_utc.isoformat()} "
                f"({first.subject.rfc4514_string()[:120]})"
            )
    tls = EndpointTls(given.client_certificate, given.client_key, given.ca_certificate)
    try:
        tls_context(tls)
    except ValueError as exc:  # an encrypted key
        raise InvalidInput(f"endpoint.tls.client_key: {exc}") from None
    except ssl.SSLError as exc:
        which = "client_key" if given.client_key is not None else "ca_certificate"
        # The reason only (KEY_VALUES_MISMATCH, ...), never the key's text.
        raise InvalidInput(
            f"endpoint.tls.{which} does not load: {exc.reason or 'bad PEM'}"
        ) from None
    return tls


def check_oauth2(body: EndpointBody) -> OAuth2Credentials | None:
    """The OAuth2 settings of ``body``, their form checked (the token URL's host is checked
    like an endpoint's by the caller: api.control.check_endpoint)."""
    given = body.oauth2
    if given is None:
        return None
    field = "endpoint.oauth2.token_url"
    endpoint_host(given.token_url, field)
    if not given.token_url.lower().startswith("https://"):
        raise InvalidInput(f"{field} must be https: the client secret goes to it")
    check_bearer_alone(body.headers)
    return OAuth2Credentials(
        token_url=given.token_url,
        client_id=given.client_id,
        client_secret=given.client_secret,
        scopes=tuple(given.scopes),
        audience=given.audience,
        client_auth=given.client_auth,
    )


def check_bearer_alone(header_names: Iterable[str]) -> None:
    """The headers of an endpoint with OAuth2 leave ``Authorization`` to the bearer token
    (checked on a request's headers, and on those a PUT keeps)."""
    if any(name.lower() == "authorization" for name in header_names):
        raise InvalidInput(
            "endpoint.headers: 'Authorization' is set by Setu when endpoint.oauth2 is given"
        )


def check_proxy(name: str | None, egress: Egress) -> str | None:
    """A proxy name the installation has (SETU_EGRESS_PROXIES)."""
    if name is not None and name not in egress.named:
        have = ", ".join(sorted(egress.named)) or "none are configured"
        raise InvalidInput(
            f"endpoint.proxy {name!r} is not one of this installation's egress proxies "
            f"(SETU_EGRESS_PROXIES: {have})"
        )
    return name
