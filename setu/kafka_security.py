"""How every Kafka client of Setu authenticates and encrypts (docs/security.md §8).

One description of the connection, :class:`KafkaSecurity`, in two spellings: librdkafka's
(:meth:`KafkaSecurity.librdkafka`: the API, delivery, the ingest job's admin client, redrive)
and the Java client's inside Spark's Kafka source and sink (:meth:`KafkaSecurity.spark_options`,
``kafka.``-prefixed options). Both spellings come from the same fields, so a broker that takes
one client of Setu takes all of them.

Secrets are :class:`pydantic.SecretStr` up to the moment a client needs them: the description's
``repr`` shows none, and only the two mappings (handed straight to a client) hold them in clear.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from pydantic import SecretStr


class SecurityProtocol(StrEnum):
    """Kafka's ``security.protocol``: what a client speaks to the broker's listener."""

    PLAINTEXT = "PLAINTEXT"
    SSL = "SSL"
    SASL_PLAINTEXT = "SASL_PLAINTEXT"
    SASL_SSL = "SASL_SSL"

    @property
    def sasl(self) -> bool:
        return self in (SecurityProtocol.SASL_PLAINTEXT, SecurityProtocol.SASL_SSL)

    @property
    def tls(self) -> bool:
        return self in (SecurityProtocol.SSL, SecurityProtocol.SASL_SSL)


class SaslMechanism(StrEnum):
    """The SASL mechanisms Setu speaks: a user name and a password, sent as they are (PLAIN,
    only sensible over TLS) or proven without being sent (SCRAM)."""

    PLAIN = "PLAIN"
    SCRAM_SHA_256 = "SCRAM-SHA-256"
    SCRAM_SHA_512 = "SCRAM-SHA-512"

    @property
    def login_module(self) -> str:
        """The Java client's JAAS login module for this mechanism."""
        if self is SaslMechanism.PLAIN:
            return "org.apache.kafka.common.security.plain.PlainLoginModule"
        return "org.apache.kafka.common.security.scram.ScramLoginModule"


class KafkaSecurityError(ValueError):
    """The Kafka security settings contradict each other (the message names the variables)."""


@dataclass(frozen=True, slots=True)
class KafkaSecurity:
    """What a Kafka client needs besides the bootstrap address (see the module doc).

    ``ca_location`` is a PEM file of the certificates that sign the brokers' (unset: the
    system's trust store for librdkafka, the JVM's for Spark). ``keystore_location`` is one PEM
    file holding the client's private key (PKCS#8) and its certificate chain, for brokers that
    ask clients for a certificate; ``key_password`` decrypts that key.
    """

    protocol: SecurityProtocol = SecurityProtocol.PLAINTEXT
    mechanism: SaslMechanism | None = None
    username: str | None = None
    password: SecretStr | None = None
    ca_location: str | None = None
    keystore_location: str | None = None
    key_password: SecretStr | None = None
    # Check that the broker's certificate names the host connected to.
    verify_hostname: bool = True

    def __post_init__(self) -> None:
        problems = self.problems()
        if problems:
            raise KafkaSecurityError("; ".join(problems))

    def problems(self) -> list[str]:
        """Contradictions between the fields, each naming its ``SETU_*`` variables."""
        found = []
        if self.protocol.sasl:
            if self.mechanism is None:
                found.append(
                    f"SETU_KAFKA_SECURITY_PROTOCOL={self.protocol} needs "
                    "SETU_KAFKA_SASL_MECHANISM (PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512)"
                )
            if not self.username or self.password is None:
                found.append(
                    f"SETU_KAFKA_SECURITY_PROTOCOL={self.protocol} needs "
                    "SETU_KAFKA_SASL_USERNAME and SETU_KAFKA_SASL_PASSWORD"
                )
        elif self.mechanism or self.username or self.password is not None:
            found.append(
                "SETU_KAFKA_SASL_* is set but SETU_KAFKA_SECURITY_PROTOCOL is "
                f"{self.protocol}: use SASL_SSL (or SASL_PLAINTEXT) for the credentials to be used"
            )
        if not self.protocol.tls and (
            self.ca_location or self.keystore_location or self.key_password is not None
        ):
            found.append(
                "SETU_KAFKA_SSL_* is set but SETU_KAFKA_SECURITY_PROTOCOL is "
                f"{self.protocol}: use SSL or SASL_SSL for TLS"
            )
        if self.key_password is not None and not self.keystore_location:
            found.append("SETU_KAFKA_SSL_KEY_PASSWORD needs SETU_KAFKA_SSL_KEYSTORE_LOCATION")
        return found

    def librdkafka(self) -> dict[str, str]:
        """librdkafka configuration entries (``confluent_kafka`` clients), to merge with
        ``bootstrap.servers`` and the client's own settings."""
        config = {"security.protocol": str(self.protocol)}
        if self.protocol.sasl and self.mechanism and self.username and self.password:
            config["sasl.mechanism"] = str(self.mechanism)
            config["sasl.username"] = self.username
            config["sasl.password"] = self.password.get_secret_value()
        if self.protocol.tls:
            config["ssl.endpoint.identification.algorithm"] = (
                "https" if self.verify_hostname else "none"
            )
            if self.ca_location:
                config["ssl.ca.location"] = self.ca_location
            if self.keystore_location:
                config["ssl.certificate.location"] = self.keystore_location
                config["ssl.key.location"] = self.keystore_location
            if self.key_password is not None:
                config["ssl.key.password"] = self.key_password.get_secret_value()
        return config

    def spark_options(self) -> dict[str, str]:
        """Options of Spark's Kafka source and sink: the Java client's settings prefixed with
        ``kafka.``, certificates as PEM files (``ssl.truststore.type=PEM``)."""
        options = {"kafka.security.protocol": str(self.protocol)}
        if self.protocol.sasl and self.mechanism and self.username and self.password:
            options["kafka.sasl.mechanism"] = str(self.mechanism)
            options["kafka.sasl.jaas.config"] = jaas_config(
                self.mechanism, self.username, self.password
            )
        if self.protocol.tls:
            # The Java client's empty algorithm turns the host name check off.
            options["kafka.ssl.endpoint.identification.algorithm"] = (
                "https" if self.verify_hostname else ""
            )
            if self.ca_location:
                options["kafka.ssl.truststore.type"] = "PEM"
                options["kafka.ssl.truststore.location"] = self.ca_location
            if self.keystore_location:
                options["kafka.ssl.keystore.type"] = "PEM"
                options["kafka.ssl.keystore.location"] = self.keystore_location
            if self.key_password is not None:
                options["kafka.ssl.key.password"] = self.key_password.get_secret_value()
        return options


def jaas_config(mechanism: SaslMechanism, username: str, password: SecretStr) -> str:
    """The Java client's ``sasl.jaas.config`` line for a user name and password.

    Kafka reads the values as quoted strings in which a backslash escapes the next character,
    so quotes and backslashes in them are escaped.
    """

    def quoted(value: str) -> str:
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'

    return (
        f"{mechanism.login_module} required "
        f"username={quoted(username)} password={quoted(password.get_secret_value())};"
    )
