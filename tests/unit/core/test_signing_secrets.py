"""Signing-secret rotation (setu.model.rotate_secrets, docs/security.md §5)."""

from __future__ import annotations

from setu.model import SigningSecret, rotate_secrets

DAY = 86_400_000


def test_the_first_secret_is_simply_held() -> None:
    new = SigningSecret("b", "vb", created_at_ms=1_000)
    assert rotate_secrets((), new, 1_000 + DAY) == (new,)


def test_a_rotation_keeps_the_current_secret_until_the_overlap_ends() -> None:
    # Given one secret
    current = SigningSecret("a", "va", created_at_ms=0)
    # When a new one comes in with a day of overlap
    new = SigningSecret("b", "vb", created_at_ms=1_000)
    held = rotate_secrets((current,), new, 1_000 + DAY)
    # Then both sign until the old one expires, the new one first
    assert [s.id for s in held] == ["b", "a"]
    assert held[1].expires_at_ms == 1_000 + DAY
    assert all(s.active(1_000 + DAY - 1) for s in held)
    assert [s.id for s in held if s.active(1_000 + DAY)] == ["b"]


def test_a_second_rotation_drops_the_oldest_so_at_most_two_are_held() -> None:
    a = SigningSecret("a", "va", created_at_ms=0)
    b = SigningSecret("b", "vb", created_at_ms=10)
    c = SigningSecret("c", "vc", created_at_ms=20)
    held = rotate_secrets(rotate_secrets((a,), b, 10 + DAY), c, 20 + DAY)
    assert [s.id for s in held] == ["c", "b"]


def test_an_overlap_never_extends_an_earlier_expiry_and_zero_ends_it_at_once() -> None:
    current = SigningSecret("a", "va", created_at_ms=0, expires_at_ms=500)
    new = SigningSecret("b", "vb", created_at_ms=100)
    assert rotate_secrets((current,), new, 100 + DAY)[1].expires_at_ms == 500
    assert rotate_secrets((current,), new, 100) == (new,)


def test_expired_secrets_are_dropped_by_the_next_rotation() -> None:
    old = SigningSecret("a", "va", created_at_ms=0, expires_at_ms=50)
    new = SigningSecret("b", "vb", created_at_ms=100)
    assert rotate_secrets((old,), new, 100 + DAY) == (new,)
