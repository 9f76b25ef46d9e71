from __future__ import annotations

import re

import pytest

from setu import names
from setu.errors import InvalidInput


@pytest.mark.parametrize("name", ["a", "orders", "order-events", "a1", "x" * 63, "0abc"])
def test_valid_names_are_accepted(name: str) -> None:
    assert names.validate_name("topic", name) == name


@pytest.mark.parametrize("name", ["", "-a", "a-", "A", "a.b", "a_b", "a b", "x" * 64, "ü", "a/b"])
def test_invalid_names_are_refused_with_a_clear_message(name: str) -> None:
    with pytest.raises(InvalidInput, match="lower-case letters"):
        names.validate_name("topic", name)


def test_derived_kafka_names_follow_the_contract() -> None:
    assert names.ingest_topic("p", "t") == "setu.p.t.ingest"
    assert names.main_topic("p", "t") == "setu.p.t"
    assert names.retry_topic("p", "s", 2) == "setu.p.s.rq.2"
    assert names.dlq_topic("p", "s") == "setu.p.s.dlq"
    assert names.consumer_group("p", "s") == "setu.sub.p.s"
    assert names.subscription_topics("p", "s", 2) == [
        "setu.p.s.rq.1",
        "setu.p.s.rq.2",
        "setu.p.s.dlq",
    ]


@pytest.mark.parametrize("tier", [0, 10])
def test_retry_tiers_outside_one_to_nine_do_not_exist(tier: int) -> None:
    with pytest.raises(ValueError, match="retry tier"):
        names.retry_topic("p", "s", tier)


@pytest.mark.parametrize(
    ("kafka_topic", "is_ingest"),
    [
        ("setu.p.t.ingest", True),
        ("setu.p.ingest", False),  # the main log of a topic named "ingest"
        ("setu.p.s.dlq", False),
        ("setu.p.s.rq.1", False),
        ("setu.p.t", False),
        ("other.p.t.ingest", False),
    ],
)
def test_the_ingest_pattern_matches_ingest_topics_only(kafka_topic: str, is_ingest: bool) -> None:
    assert bool(re.fullmatch(names.INGEST_PATTERN, kafka_topic)) is is_ingest


def test_parse_ingest_topic_round_trips() -> None:
    assert names.parse_ingest_topic(names.ingest_topic("p", "t")) == ("p", "t")
    with pytest.raises(ValueError, match="not an ingest topic"):
        names.parse_ingest_topic("setu.p.t")


@pytest.mark.parametrize("name", ["shop\n", "shop\r", "\nshop", "sh\nop"])
def test_a_name_with_a_line_break_is_refused(name: str) -> None:
    # "$" matched before a final newline: "shop\n" was taken (and the project created)
    with pytest.raises(InvalidInput):
        names.validate_name("project", name)


@pytest.mark.parametrize(
    ("name", "allowed"),
    [
        ("setu.ingest", True),
        ("setu.ingest-bench-1", True),
        ("setu.p.t.ingest", False),
        ("setu.ingest.x", False),
        ("setu.producer-marks", False),
    ],
)
def test_the_shared_ingest_log_is_named_apart_from_every_topics_kafka_names(
    name: str, allowed: bool
) -> None:
    assert bool(re.fullmatch(names.SHARED_INGEST_LOG_PATTERN, name)) is allowed
    # And no topic's ingest topic or main log can be it
    assert not re.fullmatch(names.INGEST_PATTERN, name) or not allowed
    assert name.count(".") != 2 or not allowed


def test_a_pattern_with_the_shared_log_matches_both_and_nothing_more() -> None:
    pattern = names.with_shared_log(r"^setu\.p\.[a-z0-9-]+\.ingest$", "setu.ingest-x")
    assert [bool(re.fullmatch(pattern, t)) for t in ("setu.p.t.ingest", "setu.ingest-x")] == [
        True,
        True,
    ]
    assert not re.fullmatch(pattern, "setu.ingest-xy") and not re.fullmatch(pattern, "setu.p.t")
    assert names.with_shared_log("^a$", None) == "^a$"
