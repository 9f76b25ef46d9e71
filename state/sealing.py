"""Secrets at rest (docs/security.md §5): every signing secret and endpoint header value is
stored sealed with Fernet (AES-128-CBC + HMAC-SHA256, from ``cryptography``) under a key
from ``SETU_SECRET_KEY``.

``SETU_SECRET_KEY`` is a comma-separated list of Fernet keys. The first seals; every one of
them opens, so a key is rotated by putting the new key first, restarting, running
``setu secrets rotate`` (which re-seals every stored value under the first key) and then
dropping the old key.
"""

from __future__ import annotations

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from pydantic import SecretStr

_UNOPENED = (
    "a stored secret opens with none of the keys in SETU_SECRET_KEY; "
    "was the key it was sealed with removed before `setu secrets rotate`?"
)


class SealError(Exception):
    """A stored value that no configured key opens (the key it was sealed with is gone)."""


class Sealer:
    """Seals and opens text with the configured keys. Its repr shows how many keys it has."""

    def __init__(self, keys: list[str]) -> None:
        if not keys:
            raise ValueError("at least one key is needed")
        try:
            self._fernets = [Fernet(key.strip().encode()) for key in keys]
        except (ValueError, TypeError):
            # Fernet's own message would not name the setting; the key itself is never shown.
            raise ValueError(
                "SETU_SECRET_KEY must be one or more Fernet keys (32 bytes, url-safe base64), "
                "separated by commas: make one with `setu secrets new-key`"
            ) from None
        self._box = MultiFernet(self._fernets)

    @classmethod
    def from_setting(cls, value: str) -> Sealer:
        """The sealer of a ``SETU_SECRET_KEY`` value."""
        return cls([key for key in value.split(",") if key.strip()])

    @staticmethod
    def new_key() -> str:
        """A fresh random key."""
        return Fernet.generate_key().decode()

    def seal(self, text: str) -> str:
        return self._box.encrypt(text.encode()).decode()

    def open(self, token: str) -> str:
        try:
            return self._box.decrypt(token.encode()).decode()
        except InvalidToken:
            raise SealError(_UNOPENED) from None

    def reseal(self, token: str) -> str:
        """``token`` sealed again under the first key (unchanged text)."""
        try:
            return self._box.rotate(token.encode()).decode()
        except InvalidToken:
            raise SealError(_UNOPENED) from None

    def __repr__(self) -> str:
        return f"Sealer(keys={len(self._fernets)})"


def required_sealer(setting: SecretStr | None) -> Sealer:
    """The sealer of a process that reads or writes secrets; exits with what to do when
    ``SETU_SECRET_KEY`` is missing or malformed."""
    value = setting.get_secret_value() if setting is not None else ""
    if not value.strip():
        raise SystemExit(
            "SETU_SECRET_KEY is not set: secrets are stored sealed with it "
            "(make one with `setu secrets new-key`; docs/security.md)"
        )
    try:
        return Sealer.from_setting(value)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
