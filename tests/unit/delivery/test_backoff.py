from __future__ import annotations

import pytest

from delivery.backoff import MAX_RETRY_AFTER_MS, next_attempt_at

NOW = 1_000_000


@pytest.mark.parametrize(
    ("delay", "rnd", "jitter", "retry_after", "expected"),
    [
        (5_000, 0.0, 0.1, None, NOW + 5_000),  # no jitter drawn
        (5_000, 0.5, 0.1, None, NOW + 5_250),  # half of 10%
        (5_000, 0.999, 0.1, None, NOW + 5_499),  # jitter stays below delay * jitter
        (60_000, 0.5, 0.0, None, NOW + 60_000),  # jitter off
        (5_000, 0.0, 0.1, 30_000, NOW + 30_000),  # Retry-After longer than the tier: wait it
        (5_000, 0.0, 0.1, 1_000, NOW + 5_000),  # shorter: the tier's delay still applies
        (5_000, 0.0, 0.1, 10 * MAX_RETRY_AFTER_MS, NOW + MAX_RETRY_AFTER_MS),  # capped
        (0, 0.7, 0.1, None, NOW),  # a zero delay is due at once
    ],
)
def test_next_attempt_at(
    delay: int, rnd: float, jitter: float, retry_after: int | None, expected: int
) -> None:
    assert (
        next_attempt_at(NOW, delay, rnd=rnd, jitter=jitter, retry_after_ms=retry_after) == expected
    )


@pytest.mark.parametrize("rnd", [-0.1, 1.0, 2.0])
def test_random_share_must_be_in_unit_interval(rnd: float) -> None:
    with pytest.raises(ValueError, match="rnd"):
        next_attempt_at(NOW, 100, rnd=rnd)
