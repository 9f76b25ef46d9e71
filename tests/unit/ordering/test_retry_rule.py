"""The retry rule: where a message waits after a failed attempt (``tiers.after_failure``) and
for how long (``RetryPolicy.delay_ms``). docs/delivery.md, "Retry budget"."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from setu.model import RetryPolicy
from setu.names import MAX_RETRY_TIERS
from setu.ordering.tiers import DLQ, MAIN, after_failure

# (retry tiers N, the tier the attempt failed in, its attempt number) -> where it waits next.
# A message's attempts count from its first in any tier; it moves up once they outgrow its tier.
TABLE = [
    # no retry tiers: the first failure dead-letters
    (0, MAIN, 1, DLQ),
    # N = 2: from the main log
    (2, MAIN, 1, 1),
    (2, 1, 2, 2),
    (2, 2, 3, DLQ),
    # N = 2: a message that waited behind its group in rq.1 and failed there first
    (2, 1, 1, 1),
    (2, 1, 2, 2),
    # ... or in rq.2, the last tier: it stays until its attempts outgrow the tier
    (2, 2, 1, 2),
    (2, 2, 2, 2),
    (2, 2, 3, DLQ),
    (2, 2, 4, DLQ),
    # N = 3, every tier and attempt 1..5
    *[
        (3, tier, attempt, tier if attempt <= tier else (tier + 1 if tier < 3 else DLQ))
        for tier in (MAIN, 1, 2, 3)
        for attempt in range(1, 6)
    ],
]


@pytest.mark.parametrize(("tiers", "tier", "attempt", "expected"), TABLE)
def test_after_failure(tiers: int, tier: int, attempt: int, expected: int) -> None:
    assert after_failure(attempt, tier, tiers) == expected


@given(tiers=st.integers(0, MAX_RETRY_TIERS), start=st.integers(0, MAX_RETRY_TIERS))
def test_a_message_is_dead_lettered_after_exactly_n_plus_one_attempts_and_never_moves_down(
    tiers: int, start: int
) -> None:
    tier, attempt = min(start, tiers), 0
    while tier != DLQ:
        attempt += 1
        after = after_failure(attempt, tier, tiers)
        assert after >= tier
        tier = after
    assert attempt == tiers + 1


@pytest.mark.parametrize(
    ("delays", "tier", "expected"),
    [
        ((300, 600), 1, 300),
        ((300, 600), 2, 600),
        # a tier the subscription no longer has (its delays shrank) waits the last delay
        ((300, 600), 3, 600),
        ((), 1, 0),
    ],
)
def test_each_tier_waits_its_own_delay(delays: tuple[int, ...], tier: int, expected: int) -> None:
    assert RetryPolicy(delays_ms=delays).delay_ms(tier) == expected
