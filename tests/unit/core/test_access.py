"""Roles and scopes (docs/security.md §2): a key limited to some topics."""

from __future__ import annotations

import pytest

from setu.access import Permission, Principal, Role, check, check_role
from setu.errors import Forbidden

# The README's key: role producer, project shop, topic orders only.
CHECKOUT = Principal("k1", "checkout", Role.PRODUCER, "shop", frozenset({"orders"}))


def test_a_topic_scoped_producer_may_produce_to_its_topics_only() -> None:
    check(CHECKOUT, Permission.PRODUCE, "shop", "orders")
    with pytest.raises(Forbidden, match="may not produce to topic 'payments'"):
        check(CHECKOUT, Permission.PRODUCE, "shop", "payments")
    with pytest.raises(Forbidden, match="not for project 'other'"):
        check(CHECKOUT, Permission.PRODUCE, "other", "orders")


def test_before_a_topic_is_named_only_the_role_is_checked() -> None:
    # A streaming session's HELLO names no topic: its NOTIFYs are checked against them
    check_role(CHECKOUT, Permission.PRODUCE)
    viewer = Principal("k2", "dash", Role.VIEWER, "shop")
    with pytest.raises(Forbidden, match="a viewer key may not do this"):
        check_role(viewer, Permission.PRODUCE)
