from __future__ import annotations

import pytest

from delivery.signing import sign, signing_key, webhook_headers


def test_signature_matches_the_standard_webhooks_test_vector() -> None:
    # The published vector every Standard Webhooks library verifies against.
    key = signing_key("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
    signature = sign(key, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, b'{"test": 2432232314}')
    assert signature == "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


@pytest.mark.parametrize(
    ("secret", "key"),
    [
        ("whsec_c2VjcmV0", b"secret"),  # prefix, then base64
        ("c2VjcmV0", b"secret"),  # the prefix is optional
        ("not base64!", b"not base64!"),  # a plain passphrase is used as it is
    ],
)
def test_signing_key(secret: str, key: bytes) -> None:
    assert signing_key(secret) == key


def test_headers_without_a_secret_carry_no_signature() -> None:
    assert webhook_headers("m1", 1700000000, b"body", None) == [
        ("webhook-id", "m1"),
        ("webhook-timestamp", "1700000000"),
    ]


def test_headers_with_a_secret_sign_id_timestamp_and_body() -> None:
    headers = dict(webhook_headers("m1", 1700000000, b"body", b"k"))
    assert headers["webhook-signature"] == sign(b"k", "m1", 1700000000, b"body")
    assert headers["webhook-signature"] != sign(b"k", "m1", 1700000001, b"body")
