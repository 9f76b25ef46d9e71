"""Standard Webhooks headers and signatures (https://www.standardwebhooks.com).

Every call carries ``webhook-id`` (the message id, stable across retries, so receivers can drop
repeats) and ``webhook-timestamp`` (seconds). With secrets it also carries
``webhook-signature: v1,<base64 HMAC-SHA256 of "id.timestamp.body">``, one such signature per
secret, space-separated, while a rotation holds two (docs/security.md §5).

Secrets follow the reference libraries: an optional ``whsec_`` prefix, then base64 of the key.
A secret that is not base64 is used as its UTF-8 bytes, so a plain passphrase works too.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from collections.abc import Sequence

SECRET_PREFIX = "whsec_"


def signing_key(secret: str) -> bytes:
    """The HMAC key of ``secret``."""
    text = secret.removeprefix(SECRET_PREFIX)
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return secret.encode()


def sign(key: bytes, message_id: str, timestamp_s: int, body: bytes) -> str:
    """The ``webhook-signature`` value for one call."""
    signed = b"%s.%d.%s" % (message_id.encode(), timestamp_s, body)
    digest = hmac.new(key, signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def webhook_headers(
    message_id: str, timestamp_s: int, body: bytes, keys: Sequence[bytes]
) -> list[tuple[str, str]]:
    """``webhook-id``, ``webhook-timestamp`` and, with keys, ``webhook-signature``."""
    out = [("webhook-id", message_id), ("webhook-timestamp", str(timestamp_s))]
    if keys:
        signatures = " ".join(sign(key, message_id, timestamp_s, body) for key in keys)
        out.append(("webhook-signature", signatures))
    return out
