from __future__ import annotations

from delivery.webhook import request_headers
from setu.envelope import Envelope
from setu.model import Endpoint, Subscription
from setu.signing import sign


def sub(**endpoint: object) -> Subscription:
    return Subscription("p", "s", "t", Endpoint("http://h.test/", **endpoint))  # type: ignore[arg-type]


def test_a_call_carries_setu_producer_and_standard_webhooks_headers() -> None:
    envelope = Envelope("m1", b"{}", group_id="g1", headers=(("X_TENANT", "acme"),))
    headers = request_headers(sub(), envelope, 3, 1_700_000_000, [b"key"])
    assert headers == [
        ("content-type", "application/octet-stream"),
        ("X_TENANT", "acme"),
        ("X_MESSAGE_ID", "m1"),
        ("X_GROUP_ID", "g1"),
        ("X_DELIVERY_ATTEMPT", "3"),
        ("webhook-id", "m1"),
        ("webhook-timestamp", "1700000000"),
        ("webhook-signature", sign(b"key", "m1", 1_700_000_000, b"{}")),
    ]


def test_an_endpoint_content_type_replaces_the_default_and_no_group_means_no_group_header() -> None:
    envelope = Envelope("m1", b"{}")
    headers = request_headers(
        sub(headers=(("Content-Type", "application/json"),)), envelope, 1, 5, []
    )
    names = [name for name, _ in headers]
    assert names == [
        "Content-Type",
        "X_MESSAGE_ID",
        "X_DELIVERY_ATTEMPT",
        "webhook-id",
        "webhook-timestamp",
    ]


def test_the_producer_content_type_is_sent_unless_the_endpoint_fixes_one() -> None:
    envelope = Envelope("m1", b"{}", content_type="application/json")
    assert request_headers(sub(), envelope, 1, 5, [])[0] == ("content-type", "application/json")
    fixed = sub(headers=(("Content-Type", "text/plain"),))
    headers = request_headers(fixed, envelope, 1, 5, [])
    assert [v for n, v in headers if n.lower() == "content-type"] == ["text/plain"]
