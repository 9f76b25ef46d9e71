"""Secrets at rest (state.sealing, docs/security.md §5)."""

from __future__ import annotations

import pytest
from pydantic import SecretStr

from state.sealing import Sealer, SealError, required_sealer


def test_a_sealed_value_opens_only_with_its_key_and_never_shows_the_text() -> None:
    key = Sealer.new_key()
    sealed = Sealer([key]).seal("Bearer t0p-secret")
    assert "t0p-secret" not in sealed
    assert Sealer([key]).open(sealed) == "Bearer t0p-secret"
    with pytest.raises(SealError, match="none of the keys"):
        Sealer([Sealer.new_key()]).open(sealed)


def test_key_rotation_opens_old_values_and_reseals_under_the_first_key() -> None:
    # Given a value sealed under the old key
    old, new = Sealer.new_key(), Sealer.new_key()
    sealed = Sealer([old]).seal("v")
    # When the new key is put first, beside the old one
    both = Sealer.from_setting(f"{new}, {old}")
    # Then old values still open, and resealing makes them open without the old key
    assert both.open(sealed) == "v"
    resealed = both.reseal(sealed)
    assert Sealer([new]).open(resealed) == "v"


def test_a_missing_or_malformed_key_stops_the_process_without_echoing_it() -> None:
    with pytest.raises(SystemExit, match="SETU_SECRET_KEY is not set"):
        required_sealer(None)
    with pytest.raises(SystemExit, match="Fernet keys") as caught:
        required_sealer(SecretStr("not-a-key-but-something-secret"))
    assert "something-secret" not in str(caught.value)
    assert "keys=2" in repr(Sealer.from_setting(f"{Sealer.new_key()},{Sealer.new_key()}"))
