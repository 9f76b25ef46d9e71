"""Control-plane rules: webhook URLs and hosts, headers, grouping, what a PUT may change."""

from __future__ import annotations

import ipaddress

import pytest

from api.validation import (
    check_endpoint_headers,
    check_grouping,
    check_header,
    check_update,
    endpoint_host,
    is_private_address,
    literal_host_is_private,
    refuse_private,
)
from setu.errors import InvalidInput
from setu.model import Endpoint, Subscription, Topic


@pytest.mark.parametrize(
    ("url", "host"),
    [
        ("https://hooks.example.com/orders", "hooks.example.com"),
        ("http://hooks.example.com:8080/x?y=1", "hooks.example.com"),
        ("https://[2001:db8::1]/x", "2001:db8::1"),
        ("HTTPS://Example.COM", "example.com"),
    ],
)
def test_webhook_url_gives_its_host(url: str, host: str) -> None:
    assert endpoint_host(url) == host


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("ftp://example.com/x", "http:// or https://"),
        ("example.com/x", "http:// or https://"),
        ("https:///path", "no host"),
        ("https://user:pw@example.com/", "credentials"),
        ("https://example.com:99999/", "endpoint.url"),
        ("https://example.com:0/", "port 0"),
    ],
)
def test_malformed_webhook_url_is_refused(url: str, message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        endpoint_host(url)


@pytest.mark.parametrize(
    ("address", "private"),
    [
        ("127.0.0.1", True),
        ("10.1.2.3", True),
        ("172.16.0.1", True),
        ("192.168.1.1", True),
        ("169.254.169.254", True),  # cloud metadata
        ("0.0.0.0", True),
        ("224.0.0.1", True),
        ("::1", True),
        ("fc00::1", True),
        ("fe80::1", True),
        ("::ffff:127.0.0.1", True),
        ("8.8.8.8", False),
        ("2606:4700:4700::1111", False),
        # Shared address space (a cloud metadata address among them)
        ("100.64.0.1", True),
        ("100.100.100.200", True),
        # IPv4 carried inside IPv6: 6to4, NAT64, IPv4-compatible, Teredo
        ("2002:7f00:1::1", True),
        ("2002:a00:1::1", True),
        ("64:ff9b::7f00:1", True),
        ("::7f00:1", True),
        ("2001:0:4136:e378:8000:63bf:3fff:fdd2", True),
        ("2002:808:808::1", False),  # 6to4 of 8.8.8.8
        ("198.18.0.1", True),  # benchmarking
        ("240.0.0.1", True),  # reserved
    ],
)
def test_private_addresses(address: str, private: bool) -> None:
    assert is_private_address(ipaddress.ip_address(address)) is private


@pytest.mark.parametrize(
    ("host", "private"),
    [
        ("localhost", True),
        ("LOCALHOST.", True),
        ("api.localhost", True),
        ("127.0.0.1", True),
        ("::1", True),
        ("fe80::1%eth0", True),
        ("hooks.example.com", False),
        ("8.8.8.8", False),
    ],
)
def test_literal_private_hosts_are_known_without_dns(host: str, private: bool) -> None:
    assert literal_host_is_private(host) is private


def test_host_resolving_to_a_private_address_is_refused() -> None:
    # Given a public-looking name that resolves inside the cluster
    resolved = [ipaddress.ip_address("10.0.0.7")]
    # Then it is refused, naming the setting that allows it
    with pytest.raises(InvalidInput, match="SETU_ALLOW_PRIVATE_ENDPOINTS"):
        refuse_private("svc.internal.example", resolved, allow_private=False)


def test_private_hosts_pass_when_allowed() -> None:
    refuse_private("localhost", [ipaddress.ip_address("127.0.0.1")], allow_private=True)


def test_public_host_passes() -> None:
    refuse_private("hooks.example.com", [ipaddress.ip_address("93.184.216.34")], False)


def test_endpoint_headers_keep_order() -> None:
    pairs = [("Authorization", "Bearer t"), ("X-Team", "orders")]
    assert check_endpoint_headers(pairs) == tuple(pairs)


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("Bad Name", "v", "not a valid HTTP header name"),
        ("X-Ok", "line\r\nInjected: 1", "control characters"),
        ("X-Ok", "nul\x00", "control characters"),
        ("Host", "evil", "set by Setu"),
        ("webhook-signature", "v1,x", "set by Setu"),
        ("X_MESSAGE_ID", "m", "set by Setu"),
        ("x-delivery-attempt", "1", "set by Setu"),
    ],
)
def test_bad_endpoint_headers_are_refused(name: str, value: str, message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        check_endpoint_headers([(name, value)])


def test_grouped_subscription_needs_grouped_topic() -> None:
    with pytest.raises(InvalidInput, match="grouped topic"):
        check_grouping(True, Topic("p", "t", grouped=False))


@pytest.mark.parametrize(
    ("grouped", "topic_grouped"), [(False, False), (False, True), (True, True)]
)
def test_other_groupings_are_fine(grouped: bool, topic_grouped: bool) -> None:
    check_grouping(grouped, Topic("p", "t", grouped=topic_grouped))


def _sub(**changes: object) -> Subscription:
    base = {"project": "p", "name": "s", "topic": "t", "endpoint": Endpoint("https://h/x")}
    return Subscription(**{**base, **changes})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("change", "message"),
    [({"topic": "other"}, "topic"), ({"grouped": True}, "grouped")],
)
def test_update_may_not_change_what_a_subscription_reads(
    change: dict[str, object], message: str
) -> None:
    with pytest.raises(InvalidInput, match=message):
        check_update(_sub(), _sub(**change))


def test_update_may_change_delivery() -> None:
    check_update(_sub(), _sub(endpoint=Endpoint("https://other/y"), max_in_flight=5))


@pytest.mark.parametrize(
    ("name", "value"), [("X-A", "v\n"), ("X-A", "v\r\nX-B: w"), ("X-A\n", "v"), ("X-A", "v\x00")]
)
def test_a_header_with_a_line_break_is_refused(name: str, value: str) -> None:
    # "$" matched before a final newline, so "v\n" passed the value check
    with pytest.raises(InvalidInput):
        check_header("endpoint.headers", name, value)


@pytest.mark.parametrize(
    "url",
    [
        "http://" + "a" * 64 + ".example.com/hook",  # a label over 63: an IDNA error, was a 500
        "http://example.com/a b",
        "http://example.com/\x01",
        "http://example.com/hook\n",
    ],
)
def test_a_webhook_url_dns_or_a_request_line_cannot_carry_is_refused(url: str) -> None:
    with pytest.raises(InvalidInput):
        endpoint_host(url)


def test_a_seek_past_the_largest_timestamp_is_invalid_input() -> None:
    import pydantic

    from api.operations import SeekBody

    assert SeekBody(timestamp_ms=2**63 - 1).timestamp_ms == 2**63 - 1
    with pytest.raises(pydantic.ValidationError):
        SeekBody(timestamp_ms=2**63)
