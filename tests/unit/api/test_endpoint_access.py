"""The TLS, OAuth2 and proxy settings of an endpoint as the API takes and shows them
(api/endpoint_access.py)."""

from __future__ import annotations

import datetime
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from api.endpoint_access import access_view, check_oauth2, check_proxy, check_tls
from api.schemas import EndpointBody
from setu.clock import now_ms
from setu.egress import Egress
from setu.errors import InvalidInput
from setu.model import Endpoint
from tests.tls_material import Authority

CA = Authority()
CLIENT = CA.client("orders")


def body(**endpoint: Any) -> EndpointBody:
    return EndpointBody.model_validate({"url": "https://hooks.example.com/h", **endpoint})


def test_a_client_certificate_and_its_key_are_taken_and_shown_without_the_key() -> None:
    given = body(
        tls={
            "client_certificate": CLIENT.certificate,
            "client_key": CLIENT.key,
            "ca_certificate": CA.certificate,
        }
    )
    tls = check_tls(given, now_ms())
    view = access_view(Endpoint("https://hooks.example.com/h", tls=tls))["tls"]
    assert view["client_certificate"]["subject"] == "CN=orders"
    assert view["ca_certificate"]["subject"] == "CN=Setu test CA"
    assert len(view["client_certificate"]["sha256"]) == 64
    assert view["client_certificate"]["not_after_ms"] > now_ms()
    assert view["has_client_key"] is True
    assert CLIENT.key not in str(view)


@pytest.mark.parametrize(
    ("tls", "error"),
    [
        ({"client_certificate": CLIENT.certificate}, "go together"),
        ({"client_key": CLIENT.key}, "go together"),
        (
            {"client_certificate": CA.client("other").certificate, "client_key": CLIENT.key},
            "client_key does not load: KEY_VALUES_MISMATCH",
        ),
        ({"ca_certificate": "not a certificate"}, "ca_certificate holds no PEM certificate"),
        ({}, "neither a client certificate nor a CA"),
    ],
)
def test_tls_settings_calls_would_fail_on_are_refused(tls: dict[str, str], error: str) -> None:
    with pytest.raises(InvalidInput, match=error) as refused:
        check_tls(body(tls=tls), now_ms())
    assert CLIENT.key not in str(refused.value)


def test_an_encrypted_key_is_refused_without_asking_for_a_password() -> None:
    key = serialization.load_pem_private_key(CLIENT.key.encode(), None)
    encrypted = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"pass"),
    ).decode()
    given = body(tls={"client_certificate": CLIENT.certificate, "client_key": encrypted})
    with pytest.raises(InvalidInput, match="encrypted client_key is not supported"):
        check_tls(given, now_ms())


def test_an_expired_client_certificate_is_refused_naming_when() -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "old")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now - datetime.timedelta(days=10))
        .not_valid_after(now - datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    pem = cert.public_bytes(serialization.Encoding.PEM).decode()
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    with pytest.raises(InvalidInput, match=r"client_certificate expired at .* \(CN=old\)"):
        check_tls(body(tls={"client_certificate": pem, "client_key": key_pem}), now_ms())


OAUTH2 = {"token_url": "https://auth.example.com/token", "client_id": "c", "client_secret": "s"}


def test_oauth2_credentials_are_taken_and_shown_without_the_secret() -> None:
    credentials = check_oauth2(body(oauth2={**OAUTH2, "scopes": ["a", "b:c"]}))
    assert credentials is not None
    view = access_view(Endpoint("https://h.example.com/", oauth2=credentials))["oauth2"]
    assert view == {
        "token_url": "https://auth.example.com/token",
        "client_id": "c",
        "scopes": ["a", "b:c"],
        "audience": None,
        "client_auth": "basic",
        "has_client_secret": True,
    }


@pytest.mark.parametrize(
    ("endpoint", "error"),
    [
        ({"oauth2": {**OAUTH2, "token_url": "http://auth.example.com/t"}}, "must be https"),
        ({"oauth2": {**OAUTH2, "token_url": "https://u:p@auth.example.com/t"}}, "credentials"),
        (
            {"oauth2": OAUTH2, "headers": {"authorization": "Bearer x"}},
            "'Authorization' is set by Setu",
        ),
    ],
)
def test_oauth2_settings_calls_would_fail_on_are_refused(
    endpoint: dict[str, Any], error: str
) -> None:
    with pytest.raises(InvalidInput, match=error):
        check_oauth2(body(**endpoint))


def test_a_scope_with_a_space_is_refused_by_the_schema() -> None:
    with pytest.raises(ValueError, match="scopes"):
        body(oauth2={**OAUTH2, "scopes": ["a b"]})


def test_a_proxy_is_one_the_installation_has() -> None:
    egress = Egress.parse(None, {"eu": "http://proxy.eu:3128", "us": "http://proxy.us:3128"})
    assert check_proxy("eu", egress) == "eu"
    assert check_proxy(None, egress) is None
    with pytest.raises(InvalidInput, match=r"'asia' is not one .*: eu, us\)"):
        check_proxy("asia", egress)
    with pytest.raises(InvalidInput, match="none are configured"):
        check_proxy("eu", Egress())
