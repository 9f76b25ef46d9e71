from __future__ import annotations

import base64
import secrets
import time

import pytest
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from setu.signing import sign, signing_key, webhook_headers


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
    assert webhook_headers("m1", 1700000000, b"body", []) == [
        ("webhook-id", "m1"),
        ("webhook-timestamp", "1700000000"),
    ]


def test_headers_with_a_secret_sign_id_timestamp_and_body() -> None:
    headers = dict(webhook_headers("m1", 1700000000, b"body", [b"k"]))
    assert headers["webhook-signature"] == sign(b"k", "m1", 1700000000, b"body")
    assert headers["webhook-signature"] != sign(b"k", "m1", 1700000001, b"body")


def fresh_secret() -> str:
    return "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()


@pytest.mark.parametrize("held", [1, 2])
def test_the_reference_library_verifies_a_call_with_each_secret_held(held: int) -> None:
    # Given a subscription holding one secret, or two during a rotation
    secrets_held = [fresh_secret() for _ in range(held)]
    now = int(time.time())
    body = b'{"order": 7}'
    headers = dict(
        webhook_headers("m1", now, body, [signing_key(secret) for secret in secrets_held])
    )
    # Then the call carries one v1 signature per secret, space-separated
    assert [part[:3] for part in headers["webhook-signature"].split(" ")] == ["v1,"] * held
    # And a receiver that knows any one of the secrets accepts it (Standard Webhooks' own
    # library), while a receiver with another secret refuses it
    for secret in secrets_held:
        assert Webhook(secret).verify(body, headers) == {"order": 7}
    with pytest.raises(WebhookVerificationError):
        Webhook(fresh_secret()).verify(body, headers)
    with pytest.raises(WebhookVerificationError):
        Webhook(secrets_held[0]).verify(b'{"order": 8}', headers)
