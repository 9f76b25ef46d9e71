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


PAID = Envelope(
    "m-2",
    b'{"order": {"total": 120.5, "currency": "EUR", "paid": true, "items": [{"sku": "A-1"}],'
    b' "note": null, "1": "one"}, "status": "paid"}',
    group_id="order-7",
    headers=(("X_REGION", "eu-west"),),
)


@pytest.mark.parametrize(
    ("document", "wanted"),
    [
        ({"body": "status", "equals": "paid"}, True),
        ({"body": "order.total", "equals": 120.5}, True),
        ({"body": "order.total", "gte": 100}, True),
        ({"body": "order.total", "gt": 120.5}, False),
        ({"body": "order.total", "lt": 200}, True),
        ({"body": "order.total", "lte": 120}, False),
        ({"body": "order.currency", "in": ["USD", "EUR"]}, True),
        ({"body": "order.currency", "prefix": "EU"}, True),
        ({"body": "order.currency", "gte": 1}, False),  # a comparison needs a number
        ({"body": "order.total", "prefix": "120"}, False),  # a prefix needs a string
        ({"body": "order.paid", "equals": True}, True),
        ({"body": "order.paid", "equals": 1}, False),  # true is not 1
        ({"body": "order.note", "equals": None}, True),
        ({"body": "order.note", "exists": True}, True),  # null is there
        ({"body": "order.coupon", "exists": False}, True),
        ({"body": "order.coupon", "equals": None}, False),  # absent is not null
        ({"body": "order.items.0.sku", "equals": "A-1"}, True),  # a number indexes a list
        ({"body": "order.items.1.sku", "exists": True}, False),
        ({"body": "order.1", "equals": "one"}, True),  # and names an object's key
        ({"body": "status.deeper", "exists": True}, False),
        # combined with header tests, as in DESIGN §10
        (
            {
                "all": [
                    {"header": "X_REGION", "prefix": "eu-"},
                    {"body": "order.total", "gte": 100},
                    {"not": {"body": "order.currency", "equals": "USD"}},
                ]
            },
            True,
        ),
    ],
)
def test_a_filter_decides_on_json_body_fields(document: dict[str, Any], wanted: bool) -> None:
    f = parse_filter(document)
    assert accepts(f, PAID) is wanted
    assert parse_filter(filter_json(f)) == f  # and its stored form reads back the same


@pytest.mark.parametrize(
    "document",
    [
        {"body": "status", "equals": "paid"},
        {"body": "status", "exists": False},
        {"body": "x", "gte": 0},
    ],
)
def test_a_body_that_is_not_json_never_matches_a_body_condition(document: dict[str, Any]) -> None:
    not_json = Envelope("m-3", b"status=paid", group_id="g")
    assert accepts(parse_filter(document), not_json) is False
    # and a header condition still decides on it
    assert accepts(parse_filter({"header": "X_GROUP_ID", "equals": "g"}), not_json) is True


@pytest.mark.parametrize(
    ("document", "needle"),
    [
        ({"body": "", "equals": "x"}, "filter.body: must be a dotted path"),
        ({"body": "a..b", "equals": "x"}, "non-empty segments"),
        ({"body": ".".join(["a"] * 17), "exists": True}, "16 non-empty segments"),
        ({"body": "a", "gte": "10"}, "filter.gte: must be a number"),
        ({"body": "a", "equals": {"x": 1}}, "values are strings, numbers, true, false or null"),
        ({"body": "a", "in": []}, "filter.in: must be a list of 1 to 100"),
        ({"body": "a", "equals": 1, "gt": 0}, "give exactly one of"),
        ({"body": "a", "matches": "x"}, "unknown fields ['matches']"),
        ({"any": [{"body": "a", "prefix": 7}]}, "filter.any[0].prefix: values are strings"),
    ],
)
def test_a_broken_body_test_is_refused_naming_where(document: object, needle: str) -> None:
    with pytest.raises(InvalidInput, match=needle.replace("[", r"\[").replace("]", r"\]")):
        parse_filter(document)
