"""URLs shown in a summary or a log line keep everything but their passwords."""

from __future__ import annotations

import pytest

from setu.redact import url_without_password


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
        (
            "rediss://:s3cr%40t@cache.example:6380/0?ssl_ca_certs=/etc/setu/ca.pem",
            "rediss://:***@cache.example:6380/0?ssl_ca_certs=/etc/setu/ca.pem",
        ),
        ("redis://default:pw@[::1]:6379/1", "redis://default:***@[::1]:6379/1"),
        (
            "postgresql+psycopg://setu:p%3Aw@db.example:5432/setu?sslmode=verify-full",
            "postgresql+psycopg://setu:***@db.example:5432/setu?sslmode=verify-full",
        ),
        (
            "postgresql+psycopg://setu@db/setu?password=pw&sslmode=require",
            "postgresql+psycopg://setu@db/setu?password=***&sslmode=require",
        ),
        ("postgresql+psycopg://setu@db/setu", "postgresql+psycopg://setu@db/setu"),
        ("sqlite:////var/lib/setu/setu.db", "sqlite:////var/lib/setu/setu.db"),
        ("http://[not-a-url", "***"),
    ],
)
def test_passwords_are_masked_and_the_rest_kept(url: str, shown: str) -> None:
    assert url_without_password(url) == shown
