from __future__ import annotations

import pytest

from setu.model import RetryPolicy
from setu.outcome import Verdict, classify_error, classify_status, parse_retry_after

DEFAULT = RetryPolicy()
CUSTOM = RetryPolicy(retryable_codes=(409, 503))
NOW = 1_700_000_000_000


@pytest.mark.parametrize(
    ("status", "policy", "verdict"),
    [
        (200, DEFAULT, Verdict.DELIVERED),
        (204, DEFAULT, Verdict.DELIVERED),
        (299, DEFAULT, Verdict.DELIVERED),
        (408, DEFAULT, Verdict.RETRY),
        (425, DEFAULT, Verdict.RETRY),
        (429, DEFAULT, Verdict.RETRY),
        (500, DEFAULT, Verdict.RETRY),
        (503, DEFAULT, Verdict.RETRY),
        (599, DEFAULT, Verdict.RETRY),
        (301, DEFAULT, Verdict.DEAD_LETTER),  # redirects are not followed
        (302, DEFAULT, Verdict.DEAD_LETTER),
        (400, DEFAULT, Verdict.DEAD_LETTER),
        (401, DEFAULT, Verdict.DEAD_LETTER),
        (404, DEFAULT, Verdict.DEAD_LETTER),
        (409, DEFAULT, Verdict.DEAD_LETTER),
        (422, DEFAULT, Verdict.DEAD_LETTER),
        (101, DEFAULT, Verdict.DEAD_LETTER),
        # A subscription's own list replaces the defaults entirely.
        (409, CUSTOM, Verdict.RETRY),
        (503, CUSTOM, Verdict.RETRY),
        (500, CUSTOM, Verdict.DEAD_LETTER),
        (429, CUSTOM, Verdict.DEAD_LETTER),
        (200, CUSTOM, Verdict.DELIVERED),
    ],
)
def test_status_classification(status: int, policy: RetryPolicy, verdict: Verdict) -> None:
    assert classify_status(status, policy).verdict is verdict


@pytest.mark.parametrize("error", ["timeout", "connection refused", "connection reset"])
def test_no_answer_is_always_retried(error: str) -> None:
    outcome = classify_error(error)
    assert outcome.verdict is Verdict.RETRY
    assert outcome.reason == error


@pytest.mark.parametrize(
    ("value", "expected_ms"),
    [
        (None, None),
        ("0", 0),
        ("7", 7_000),
        (" 120 ", 120_000),
        ("Tue, 14 Nov 2023 22:13:30 GMT", 10_000),  # NOW is 22:13:20 GMT
        ("Tue, 14 Nov 2023 22:13:00 GMT", 0),  # in the past: no wait
        ("soon", None),
        ("-5", None),
        ("1.5", None),
        ("", None),
    ],
)
def test_retry_after_parsing(value: str | None, expected_ms: int | None) -> None:
    assert parse_retry_after(value, NOW) == expected_ms


def test_retry_after_is_kept_on_retries_only() -> None:
    assert classify_status(503, DEFAULT, "3", NOW).retry_after_ms == 3_000
    assert classify_status(429, DEFAULT, "3", NOW).retry_after_ms == 3_000
    assert classify_status(400, DEFAULT, "3", NOW).retry_after_ms is None
    assert classify_status(200, DEFAULT, "3", NOW).retry_after_ms is None


def test_reason_names_the_status() -> None:
    assert classify_status(503, DEFAULT).reason == "status 503"
