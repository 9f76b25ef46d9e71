"""Who the streaming listener serves (api/stream_server.py): connections that have not said
HELLO are capped apart from sessions and the idlest is turned away first, sessions are capped in
all and per key, and refusals are logged at most once per interval."""

from __future__ import annotations

import logging

import pytest

from api.stream_server import (
    Admission,
    ConnectionLimits,
    RefusalLog,
    connection_limits,
)
from setu.settings import Settings


def limits(
    *, max_pending: int = 3, max_sessions: int = 4, max_sessions_per_key: int = 2
) -> ConnectionLimits:
    return ConnectionLimits(
        hello_timeout_s=3.0,
        idle_timeout_s=30.0,
        max_pending=max_pending,
        max_sessions=max_sessions,
        max_sessions_per_key=max_sessions_per_key,
        max_streams_per_session=100,
    )


def test_connections_under_the_pending_cap_are_all_served() -> None:
    admission: Admission[str] = Admission(limits(max_pending=3))
    assert [admission.arrive(c) for c in ("a", "b", "c")] == [None, None, None]
    assert admission.pending == 3
    assert list(admission.reading()) == ["a", "b", "c"]


def test_over_the_pending_cap_the_connection_that_waited_longest_for_hello_goes() -> None:
    # Given three connections waiting for their HELLO, the cap
    admission: Admission[str] = Admission(limits(max_pending=3))
    for connection in ("a", "b", "c"):
        admission.arrive(connection)
    # When two more arrive
    # Then each turns away the oldest still waiting, and the count stays at the cap
    assert admission.arrive("d") == "a"
    assert admission.arrive("e") == "b"
    assert list(admission.reading()) == ["c", "d", "e"]
    assert admission.pending == 3


def test_a_connection_whose_hello_is_whole_is_not_turned_away() -> None:
    # Given three pending connections, the oldest two with their HELLO read (keys being checked)
    admission: Admission[str] = Admission(limits(max_pending=3))
    for connection in ("a", "b", "c"):
        admission.arrive(connection)
    admission.greeted("a")
    admission.greeted("b")
    # When one more arrives: it turns away the one still reading
    assert admission.arrive("d") == "c"
    # And when every pending one has sent its HELLO, a newcomer turns itself away
    admission.greeted("d")
    assert admission.arrive("e") == "e"
    assert admission.pending == 3


def test_sessions_do_not_count_toward_the_pending_cap_nor_pending_toward_sessions() -> None:
    # Given a listener of one session and one pending connection, its session open
    admission: Admission[str] = Admission(
        limits(max_pending=1, max_sessions=1, max_sessions_per_key=1)
    )
    assert admission.arrive("producer") is None
    admission.greeted("producer")
    assert admission.open("producer", "k1") is None
    # When another connection arrives and idles
    # Then it is pending beside the session, not turned away, and it took no session
    assert admission.arrive("idle") is None
    assert admission.pending == 1
    assert list(admission.opened) == ["producer"]


def test_past_max_sessions_a_session_is_refused_as_retryable() -> None:
    admission: Admission[str] = Admission(limits(max_sessions=2, max_sessions_per_key=5))
    for connection in ("a", "b", "c"):
        admission.arrive(connection)
        admission.greeted(connection)
    assert admission.open("a", "k1") is None
    assert admission.open("b", "k2") is None
    refused = admission.open("c", "k3")
    assert refused is not None and refused.code == "dependency_unavailable"
    assert "too many streaming sessions" in str(refused)
    assert admission.pending == 0  # refused, counted nowhere


def test_one_key_holds_at_most_its_share_of_sessions_and_gets_it_back_as_they_end() -> None:
    # Given a key holding its two sessions
    admission: Admission[str] = Admission(limits(max_sessions=10, max_sessions_per_key=2))
    for connection in ("a1", "a2", "a3", "b1", "a4"):
        admission.arrive(connection)
        admission.greeted(connection)
    assert admission.open("a1", "ka") is None
    assert admission.open("a2", "ka") is None
    # When it asks for a third: refused with rate_limited, while another key still gets one
    refused = admission.open("a3", "ka")
    assert refused is not None and refused.code == "rate_limited"
    assert "2 streaming sessions" in str(refused)
    assert admission.open("b1", "kb") is None
    # And once one of its sessions ends, the key may open one again
    admission.leave("a1")
    assert admission.open("a4", "ka") is None
    assert sorted(admission.opened) == ["a2", "a4", "b1"]


def test_leaving_in_any_state_frees_the_slot() -> None:
    admission: Admission[str] = Admission(limits(max_pending=2))
    admission.arrive("reading")
    admission.arrive("checking")
    admission.greeted("checking")
    admission.leave("reading")
    admission.leave("checking")
    admission.leave("never-seen")
    assert admission.pending == 0
    assert admission.arrive("next") is None


@pytest.mark.parametrize(
    ("max_sessions", "per_key", "expected"),
    [(1_000, None, 250), (3, None, 1), (1_000, 7, 7)],
)
def test_one_keys_sessions_default_to_a_quarter_of_all(
    max_sessions: int, per_key: int | None, expected: int
) -> None:
    settings = Settings(stream_max_sessions_per_key=per_key)
    assert connection_limits(settings, max_sessions).max_sessions_per_key == expected


def test_the_hello_timeout_defaults_to_a_few_seconds() -> None:
    made = connection_limits(Settings(), 1_000)
    assert made.hello_timeout_s == 3.0
    assert made.max_pending == 256


def test_refusals_are_logged_at_most_once_per_interval_with_their_counts(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Given a refusal log of one line per 10 s, on a clock the test moves
    now = [100.0]
    refusals = RefusalLog(every_s=10.0, clock=lambda: now[0])
    caplog.set_level(logging.DEBUG, logger="api.stream_server")
    # When 50 connections are refused within 10 s, then 1 more after them
    refusals.note("peer-0", "protocol_error: no HELLO in time")
    for n in range(1, 50):
        now[0] += 0.1
        refusals.note(f"peer-{n}", "unauthorized: unknown API key" if n % 2 else "protocol_error")
    now[0] = 110.0
    refusals.note("peer-50", "unauthorized: unknown API key")
    # Then two WARNING lines: the first refusal, then the 50 since it, by code
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2
    assert "1 protocol_error" in warnings[0]
    assert "24 protocol_error, 26 unauthorized" in warnings[1]
    # And every refusal at DEBUG
    assert sum(r.levelno == logging.DEBUG for r in caplog.records) == 51
