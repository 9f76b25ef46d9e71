"""Kafka security settings -> librdkafka config and Spark's Kafka options (docs/security.md §8)."""

from __future__ import annotations

import logging

import pytest
from pydantic import SecretStr, ValidationError

from setu.kafka_security import (
    KafkaSecurity,
    KafkaSecurityError,
    SaslMechanism,
    SecurityProtocol,
    jaas_config,
)
from setu.settings import Settings

PASSWORD = 'pa"ss\\word-31f7'
KEY_PASSWORD = "key-pass-8c2d"


def scram(protocol: SecurityProtocol = SecurityProtocol.SASL_SSL, **more: object) -> KafkaSecurity:
    return KafkaSecurity(
        protocol=protocol,
        mechanism=SaslMechanism.SCRAM_SHA_512,
        username="setu",
        password=SecretStr(PASSWORD),
        **more,  # type: ignore[arg-type]
    )


def test_plaintext_by_default_adds_nothing_but_the_protocol() -> None:
    security = Settings().kafka_security()
    assert security.librdkafka() == {"security.protocol": "PLAINTEXT"}
    assert security.spark_options() == {"kafka.security.protocol": "PLAINTEXT"}


def test_sasl_ssl_with_scram_and_a_private_ca_for_librdkafka() -> None:
    security = scram(ca_location="/etc/setu/kafka-ca.pem")
    assert security.librdkafka() == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "setu",
        "sasl.password": PASSWORD,
        "ssl.endpoint.identification.algorithm": "https",
        "ssl.ca.location": "/etc/setu/kafka-ca.pem",
    }


def test_sasl_ssl_with_scram_and_a_private_ca_for_spark() -> None:
    options = scram(ca_location="/etc/setu/kafka-ca.pem").spark_options()
    assert options == {
        "kafka.security.protocol": "SASL_SSL",
        "kafka.sasl.mechanism": "SCRAM-SHA-512",
        "kafka.sasl.jaas.config": (
            "org.apache.kafka.common.security.scram.ScramLoginModule required "
            'username="setu" password="pa\\"ss\\\\word-31f7";'
        ),
        "kafka.ssl.endpoint.identification.algorithm": "https",
        "kafka.ssl.truststore.type": "PEM",
        "kafka.ssl.truststore.location": "/etc/setu/kafka-ca.pem",
    }


def test_plain_uses_the_plain_login_module_and_scram_256_the_scram_one() -> None:
    plain = KafkaSecurity(
        protocol=SecurityProtocol.SASL_PLAINTEXT,
        mechanism=SaslMechanism.PLAIN,
        username="u",
        password=SecretStr("p"),
    )
    assert plain.spark_options()["kafka.sasl.jaas.config"] == (
        "org.apache.kafka.common.security.plain.PlainLoginModule required "
        'username="u" password="p";'
    )
    assert plain.librdkafka()["sasl.mechanism"] == "PLAIN"
    # No TLS on a plaintext listener: nothing of it is set
    assert not any(key.startswith("ssl.") for key in plain.librdkafka())
    assert not any(key.startswith("kafka.ssl.") for key in plain.spark_options())
    assert jaas_config(SaslMechanism.SCRAM_SHA_256, "u", SecretStr("p")).startswith(
        "org.apache.kafka.common.security.scram.ScramLoginModule required "
    )


def test_a_client_certificate_is_one_pem_file_for_both_clients() -> None:
    security = KafkaSecurity(
        protocol=SecurityProtocol.SSL,
        ca_location="/ca.pem",
        keystore_location="/client.pem",
        key_password=SecretStr(KEY_PASSWORD),
        verify_hostname=False,
    )
    config = security.librdkafka()
    assert config["ssl.certificate.location"] == config["ssl.key.location"] == "/client.pem"
    assert config["ssl.key.password"] == KEY_PASSWORD
    assert config["ssl.endpoint.identification.algorithm"] == "none"
    assert not any(key.startswith("sasl.") for key in config)
    options = security.spark_options()
    assert options["kafka.ssl.keystore.type"] == "PEM"
    assert options["kafka.ssl.keystore.location"] == "/client.pem"
    assert options["kafka.ssl.key.password"] == KEY_PASSWORD
    # The Java client's way of not checking the host name
    assert options["kafka.ssl.endpoint.identification.algorithm"] == ""


def test_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SETU_KAFKA_SECURITY_PROTOCOL", "SASL_SSL")
    monkeypatch.setenv("SETU_KAFKA_SASL_MECHANISM", "SCRAM-SHA-256")
    monkeypatch.setenv("SETU_KAFKA_SASL_USERNAME", "setu")
    monkeypatch.setenv("SETU_KAFKA_SASL_PASSWORD", PASSWORD)
    monkeypatch.setenv("SETU_KAFKA_SSL_CA_LOCATION", "/ca.pem")
    monkeypatch.setenv("SETU_KAFKA_SSL_ENDPOINT_IDENTIFICATION", "false")
    config = Settings().kafka_client_config()
    assert config["security.protocol"] == "SASL_SSL"
    assert config["sasl.mechanism"] == "SCRAM-SHA-256"
    assert config["sasl.password"] == PASSWORD
    assert config["ssl.ca.location"] == "/ca.pem"
    assert config["ssl.endpoint.identification.algorithm"] == "none"


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"kafka_security_protocol": "SASL_SSL"}, "SETU_KAFKA_SASL_MECHANISM"),
        (
            {"kafka_security_protocol": "SASL_PLAINTEXT", "kafka_sasl_mechanism": "PLAIN"},
            "SETU_KAFKA_SASL_USERNAME and SETU_KAFKA_SASL_PASSWORD",
        ),
        ({"kafka_sasl_password": PASSWORD}, "SETU_KAFKA_SECURITY_PROTOCOL is PLAINTEXT"),
        (
            {"kafka_security_protocol": "SASL_PLAINTEXT", "kafka_ssl_ca_location": "/ca.pem"},
            "SETU_KAFKA_SSL_* is set but SETU_KAFKA_SECURITY_PROTOCOL is SASL_PLAINTEXT",
        ),
        (
            {"kafka_security_protocol": "SSL", "kafka_ssl_key_password": KEY_PASSWORD},
            "SETU_KAFKA_SSL_KEY_PASSWORD needs SETU_KAFKA_SSL_KEYSTORE_LOCATION",
        ),
    ],
)
def test_contradicting_settings_stop_the_process_naming_the_variables(
    settings: dict[str, str], named: str
) -> None:
    with pytest.raises(ValidationError) as refused:
        Settings(**settings)  # type: ignore[arg-type]
    assert named in str(refused.value)
    # The refusal never echoes what it was given, passwords included
    assert PASSWORD not in str(refused.value)
    assert KEY_PASSWORD not in str(refused.value)


def test_the_security_description_itself_refuses_contradictions() -> None:
    with pytest.raises(KafkaSecurityError, match="SETU_KAFKA_SASL_MECHANISM"):
        KafkaSecurity(protocol=SecurityProtocol.SASL_SSL, username="u", password=SecretStr("p"))


def test_passwords_never_show_in_repr_str_or_log_lines(caplog: pytest.LogCaptureFixture) -> None:
    settings = Settings(
        kafka_security_protocol=SecurityProtocol.SASL_SSL,
        kafka_sasl_mechanism=SaslMechanism.SCRAM_SHA_256,
        kafka_sasl_username="setu",
        kafka_sasl_password=SecretStr(PASSWORD),
        kafka_ssl_keystore_location="/client.pem",
        kafka_ssl_key_password=SecretStr(KEY_PASSWORD),
    )
    security = settings.kafka_security()
    log = logging.getLogger("setu.test")
    with caplog.at_level(logging.DEBUG):
        log.info("settings %s / %r", settings, settings)
        log.info("security %s / %r", security, security)
        log.info("dump %s", settings.model_dump())
    shown = [repr(settings), str(settings), repr(security), str(security), caplog.text]
    for text in shown:
        # Not even part of one, escaped or not
        assert "word-31f7" not in text
        assert KEY_PASSWORD not in text
    # They are there for the clients, and only there
    assert security.librdkafka()["sasl.password"] == PASSWORD
    assert "word-31f7" in security.spark_options()["kafka.sasl.jaas.config"]
