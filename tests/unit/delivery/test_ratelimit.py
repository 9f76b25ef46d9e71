from __future__ import annotations

import pytest

from delivery.ratelimit import TokenBucket


def test_a_burst_is_free_then_calls_are_spaced_at_the_rate() -> None:
    # Given 10 calls per second with a burst of 2
    bucket = TokenBucket(10, burst=2, now=0.0)
    # When five calls come at once
    waits = [bucket.reserve(0.0) for _ in range(5)]
    # Then two go now and the rest are spaced 100 ms apart
    assert waits == pytest.approx([0.0, 0.0, 0.1, 0.2, 0.3])


def test_tokens_refill_with_time_up_to_the_burst() -> None:
    bucket = TokenBucket(10, burst=2, now=0.0)
    assert bucket.reserve(0.0) == 0.0
    assert bucket.reserve(0.0) == 0.0
    # A long pause refills only up to the burst
    assert bucket.reserve(100.0) == 0.0
    assert bucket.reserve(100.0) == 0.0
    assert bucket.reserve(100.0) == pytest.approx(0.1)


@pytest.mark.parametrize("rate", [1.0, 50.0, 1000.0])
def test_the_long_run_rate_is_the_configured_rate(rate: float) -> None:
    bucket = TokenBucket(rate, now=0.0)
    last_wait = 0.0
    for _ in range(int(rate * 4)):
        last_wait = bucket.reserve(0.0)
    # 4 s worth of calls at once: the last one waits about 4 s minus the burst
    assert last_wait == pytest.approx(4.0 - bucket.burst / rate, abs=1 / rate)


def test_rate_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        TokenBucket(0)
