from __future__ import annotations

from typing import Any

import pytest

from setu.envelope import Envelope
from setu.errors import InvalidInput
from setu.policies import (
    BreakerPolicy,
    DeadLetterWindow,
    Policies,
    StartFrom,
    accepts,
    filter_json,
    parse_filter,
    parse_start_from,
)

ORDER = Envelope(
    "m-1",
    b"{}",
    group_id="order-7",
    headers=(("x-event-type", "order.paid"), ("X_REGION", "eu-west"), ("X_REGION", "us")),
)


@pytest.mark.parametrize(
    ("document", "wanted"),
    [
        ({"header": "X_EVENT_TYPE", "equals": "order.paid"}, True),
        ({"header": "x-event-type", "equals": "ORDER.PAID"}, False),  # values are exact
        ({"header": "X-Event-Type", "in": ["order.created", "order.paid"]}, True),
        ({"header": "X_EVENT_TYPE", "in": ["order.created"]}, False),
        ({"header": "X_REGION", "prefix": "eu-"}, True),  # the first of a repeated header
        ({"header": "X_GROUP_ID", "prefix": "order-"}, True),
        ({"header": "x_group_id", "equals": "order-8"}, False),
        ({"header": "X_TENANT", "exists": True}, False),
        ({"header": "X_TENANT", "exists": False}, True),
        ({"header": "X_TENANT", "equals": ""}, False),  # a missing header equals nothing
        ({"not": {"header": "X_TENANT", "exists": True}}, True),
        (
            {
                "all": [
                    {"header": "X_EVENT_TYPE", "prefix": "order."},
                    {
                        "any": [
                            {"header": "X_REGION", "equals": "us"},
                            {"header": "X_GROUP_ID", "equals": "order-7"},
                        ]
                    },
                ]
            },
            True,
        ),
        (
            {
                "all": [
                    {"header": "X_EVENT_TYPE", "prefix": "order."},
                    {"header": "X_TENANT", "exists": True},
                ]
            },
            False,
        ),
    ],
)
def test_a_filter_decides_on_producer_headers_and_the_group_id(
    document: dict[str, Any], wanted: bool
) -> None:
    f = parse_filter(document)
    assert accepts(f, ORDER) is wanted
    assert filter_json(f) == document  # shown as written


def test_no_filter_accepts_everything() -> None:
    assert accepts(None, Envelope("m", b""))


@pytest.mark.parametrize(
    ("document", "needle"),
    [
        ([], "filter: must be an object"),
        ({}, 'filter: needs "header"'),
        ({"header": "X_A"}, 'exactly one of "equals"'),
        ({"header": "X_A", "equals": "1", "prefix": "1"}, 'exactly one of "equals"'),
        ({"header": "X_A", "equals": 1}, "filter.equals: values are strings"),
        ({"header": "X_A", "in": []}, "filter.in: must be a list of 1 to 100"),
        ({"header": "X_A", "in": ["v"] * 101}, "filter.in: must be a list"),
        ({"header": "X_A", "exists": "yes"}, "filter.exists: must be true or false"),
        ({"header": "Content-Type", "exists": True}, "is not an X_* header"),
        ({"header": "X_DELIVERY_ATTEMPT", "exists": True}, "is set by Setu"),
        ({"header": "X_A", "equals": "v", "other": 1}, "unknown fields ['other']"),
        ({"all": []}, "filter.all: must be a non-empty list"),
        ({"any": [{"header": "X_A", "exists": True}, 5]}, "filter.any[1]: must be an object"),
        ({"not": {"header": "X_A"}, "all": []}, "'all' takes no other fields"),
        ({"header": "X_A", "equals": "v" * 1025}, "at most 1024 characters"),
    ],
)
def test_a_broken_filter_is_refused_naming_where(document: object, needle: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        parse_filter(document)
    assert needle in caught.value.message


def test_filters_are_bounded_in_depth_and_size() -> None:
    deep: dict[str, Any] = {"header": "X_A", "exists": True}
    for _ in range(8):
        deep = {"not": deep}
    with pytest.raises(InvalidInput, match="nest at most 8"):
        parse_filter(deep)
    wide = {"any": [{"header": "X_A", "equals": str(i)} for i in range(64)]}
    with pytest.raises(InvalidInput, match="more than 64"):
        parse_filter(wide)


@pytest.mark.parametrize(
    ("document", "start"),
    [
        ("earliest", StartFrom()),
        ("latest", StartFrom("latest")),
        ({"timestamp_ms": 1_700_000_000_000}, StartFrom("timestamp", 1_700_000_000_000)),
    ],
)
def test_start_from_parses_and_names_the_seek(document: object, start: StartFrom) -> None:
    assert parse_start_from(document) == start
    assert start.json() == document
    assert start.seek_to_ms(42) == {"earliest": None, "latest": 42}.get(
        start.kind, start.timestamp_ms
    )


@pytest.mark.parametrize(
    "document", ["newest", {"timestamp_ms": -1}, {"timestamp_ms": True}, {"at": 1}, None]
)
def test_a_broken_start_from_is_refused(document: object) -> None:
    with pytest.raises(InvalidInput, match="start_from"):
        parse_start_from(document)


def test_policies_survive_their_stored_form() -> None:
    policies = Policies(
        filter=parse_filter({"header": "X_A", "in": ["1", "2"]}),
        circuit_breaker=BreakerPolicy(0.25, 5, 10, 2),
        auto_pause_after_s=None,
        dead_letter_window=DeadLetterWindow(10, 3),
        start_from=StartFrom("timestamp", 5),
    )
    assert Policies.from_json(policies.json()) == policies
    off = Policies(circuit_breaker=None)
    assert Policies.from_json(off.json()) == off
    # Rows written before policies existed: every policy at its default.
    assert Policies.from_json(None) == Policies()
