"""Certificates for tests: a CA, a server certificate it signs (for ``localhost`` and
127.0.0.1) and client certificates, as PEM text, made with ``cryptography``."""

from __future__ import annotations

import datetime
import ipaddress
import ssl
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Identity:
    """A certificate and its private key (PEM)."""

    certificate: str
    key: str = field(repr=False)


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key: ec.EllipticCurvePrivateKey) -> str:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()


class Authority:
    """A CA that signs server and client certificates, valid from an hour ago for a day."""

    def __init__(self, name: str = "Setu test CA") -> None:
        self._key = _key()
        self._name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = datetime.datetime.now(datetime.UTC)
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(self._name)
            .issuer_name(self._name)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(self._key, hashes.SHA256())
        )
        self.certificate = self._cert.public_bytes(serialization.Encoding.PEM).decode()

    def _issue(
        self, common_name: str, usage: x509.ObjectIdentifier, sans: list[x509.GeneralName]
    ) -> Identity:
        key = _key()
        now = datetime.datetime.now(datetime.UTC)
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(self._name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        return Identity(cert.public_bytes(serialization.Encoding.PEM).decode(), _pem_key(key))

    def server(self, host: str = "localhost") -> Identity:
        return self._issue(
            host,
            ExtendedKeyUsageOID.SERVER_AUTH,
            [x509.DNSName(host), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))],
        )

    def client(self, name: str = "setu-delivery") -> Identity:
        return self._issue(name, ExtendedKeyUsageOID.CLIENT_AUTH, [])


def server_context(identity: Identity, client_ca: str | None = None) -> ssl.SSLContext:
    """A server context showing ``identity``; with ``client_ca``, it requires a client
    certificate that CA signed (mutual TLS)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    with tempfile.TemporaryDirectory() as private:
        path = Path(private) / "server.pem"
        path.write_text(identity.certificate + identity.key)
        context.load_cert_chain(path)
    if client_ca is not None:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(cadata=client_ca)
    return context
