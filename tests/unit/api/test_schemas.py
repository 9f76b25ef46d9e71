"""Request bodies: defaults of docs/design.md §5, strict types, bounds; views hide the secret."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from api.schemas import (
    SubscriptionCreate,
    SubscriptionUpdate,
    TopicCreate,
    subscription_view,
    topic_view,
)
from setu.model import Endpoint, SigningSecret, Subscription, Topic


def test_topic_defaults_are_those_of_the_design() -> None:
    body = TopicCreate.model_validate({"name": "orders"})
    assert (body.grouped, body.partitions, body.retention_hours) == (False, 6, 168)


@pytest.mark.parametrize(
    "body",
    [
        {"name": "t", "partitions": 0},
        {"name": "t", "partitions": 1001},
        {"name": "t", "partitions": "6"},
        {"name": "t", "partitions": 6.0},
        {"name": "t", "grouped": "yes"},
        {"name": "t", "retention_hours": 0},
        {"name": "t", "colour": "blue"},
        {"name": ""},
        {},
    ],
)
def test_bad_topic_bodies_are_refused(body: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        TopicCreate.model_validate(body)


def _subscription(**changes: Any) -> dict[str, Any]:
    return {"name": "s", "topic": "t", "endpoint": {"url": "https://h/x"}, **changes}


def test_subscription_defaults_are_those_of_the_design() -> None:
    body = SubscriptionCreate.model_validate(_subscription())
    assert body.endpoint.method == "POST"
    assert body.endpoint.timeout_ms == 10_000
    assert body.retry.delays_ms == [5_000, 60_000, 600_000]
    assert body.retry.retryable_codes is None
    assert body.dead_letter_policy == "park"
    assert body.max_in_flight == 256
    assert body.grouped is None  # as grouped as its topic


@pytest.mark.parametrize(
    "changes",
    [
        {"retry": {"delays_ms": []}},
        {"retry": {"delays_ms": [0] * 9}},
        {"retry": {"delays_ms": [1, 2], "retryable_codes": [500, 503]}},
        {"max_in_flight": 1},
        {"max_in_flight": 10_000},
        {"rate_limit_per_second": 2.5},
        {"endpoint": {"url": "https://h/x", "method": "PATCH", "timeout_ms": 100}},
        {"dead_letter_policy": "skip", "grouped": True, "signing_secret": "whsec_abc"},
    ],
)
def test_good_subscription_bodies_pass(changes: dict[str, Any]) -> None:
    SubscriptionCreate.model_validate(_subscription(**changes))


@pytest.mark.parametrize(
    "changes",
    [
        {"retry": {"delays_ms": [0] * 10}},
        {"retry": {"delays_ms": [-1]}},
        {"retry": {"retryable_codes": [99]}},
        {"retry": {"retryable_codes": [600]}},
        {"max_in_flight": 0},
        {"max_in_flight": 10_001},
        {"endpoint": {"url": "https://h/x", "method": "GET"}},
        {"endpoint": {"url": "https://h/x", "timeout_ms": 99}},
        {"endpoint": {"url": "https://h/x", "timeout_ms": 120_001}},
        {"endpoint": {"url": "https://h/x", "headers": {"a": 1}}},
        {"dead_letter_policy": "drop"},
        {"rate_limit_per_second": 0},
        {"signing_secret": ""},
        {"state": "paused"},
    ],
)
def test_bad_subscription_bodies_are_refused(changes: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        SubscriptionCreate.model_validate(_subscription(**changes))


def test_update_needs_a_version() -> None:
    with pytest.raises(ValidationError):
        SubscriptionUpdate.model_validate({"endpoint": {"url": "https://h/x"}})


def test_update_knows_whether_the_secret_was_given() -> None:
    # Given one update that leaves the secret out and one that clears it
    kept = SubscriptionUpdate.model_validate({"version": 1, "endpoint": {"url": "https://h"}})
    cleared = SubscriptionUpdate.model_validate(
        {"version": 1, "endpoint": {"url": "https://h"}, "signing_secret": None}
    )
    # Then they can be told apart
    assert "signing_secret" not in kept.model_fields_set
    assert "signing_secret" in cleared.model_fields_set


def test_subscription_view_never_shows_a_secret() -> None:
    # Given a subscription with a header value and two signing secrets, the older expiring
    sub = Subscription(
        "p",
        "s",
        "t",
        Endpoint("https://h/x", headers=(("Authorization", "Bearer h3ader-value"),)),
        signing_secrets=(
            SigningSecret("ss_new", "whsec_top", 5),
            SigningSecret("ss_old", "whsec_old", 1, expires_at_ms=2**62),
        ),
    )
    view = subscription_view(sub)
    # Then the view names them and their times, never a value, and neither does a repr
    assert view["has_signing_secret"] is True
    assert view["signing_secrets"] == [
        {"id": "ss_new", "created_at_ms": 5, "expires_at_ms": None},
        {"id": "ss_old", "created_at_ms": 1, "expires_at_ms": 2**62},
    ]
    assert view["endpoint"]["header_names"] == ["Authorization"]
    for text in (repr(view), repr(sub), str(sub)):
        assert "whsec_top" not in text and "whsec_old" not in text and "h3ader" not in text
    assert view["kafka"]["retry_topics"] == ["setu.p.s.rq.1", "setu.p.s.rq.2", "setu.p.s.rq.3"]
    assert view["kafka"]["dlq_topic"] == "setu.p.s.dlq"
    assert view["kafka"]["consumer_group"] == "setu.sub.p.s"


def test_topic_view_names_its_kafka_topics() -> None:
    view = topic_view(Topic("p", "orders"))
    assert view["kafka"] == {
        "ingest_topic": "setu.p.orders.ingest",
        "main_topic": "setu.p.orders",
        "ingest_rejects_topic": "setu.p.orders.ingest.rejects",
    }


def test_request_becomes_a_running_subscription_grouped_like_its_topic() -> None:
    from api.subscriptions import to_subscription

    # Given a body that says nothing of grouping, on a grouped topic
    body = SubscriptionCreate.model_validate(
        _subscription(retry={"delays_ms": [10, 20], "retryable_codes": [503, 500, 503]})
    )
    sub = to_subscription(
        "p", "s", Topic("p", "t", grouped=True), body, signing_secrets=(), default_grouped=True
    )
    # Then the subscription is grouped, running, with its codes de-duplicated in order
    assert sub.grouped is True
    assert sub.state.value == "running"
    assert sub.retry.delays_ms == (10, 20)
    assert sub.retry.retryable_codes == (500, 503)


def test_request_with_a_bad_subscription_name_is_refused() -> None:
    from pydantic import ValidationError

    from api.subscriptions import to_subscription
    from setu.errors import InvalidInput

    # In a body, by the documented pattern; in a path (PUT), by the same rule in code
    with pytest.raises(ValidationError, match="pattern"):
        SubscriptionCreate.model_validate(_subscription(name="Bad_Name"))
    body = SubscriptionCreate.model_validate(_subscription())
    with pytest.raises(InvalidInput, match="subscription name"):
        to_subscription(
            "p", "Bad_Name", Topic("p", "t"), body, signing_secrets=(), default_grouped=False
        )


def test_a_view_that_drifts_from_its_documented_model_is_refused() -> None:
    import pydantic
    import pytest

    from api.responses import reply
    from api.schemas import ProducerMarkOut

    assert reply(ProducerMarkOut, {"producer_id": "p", "last_sequence_id": 3}).status_code == 200
    with pytest.raises(pydantic.ValidationError):
        reply(ProducerMarkOut, {"producer_id": "p", "last_sequence_id": 3, "secret": "x"})
    with pytest.raises(pydantic.ValidationError):
        reply(ProducerMarkOut, {"producer_id": "p"})


@pytest.mark.parametrize(
    "body",
    [
        {"name": "shop", "description": "a\x00b"},
        {"name": "shop\x00"},
    ],
)
def test_a_nul_character_in_a_body_is_invalid_input(body: dict[str, object]) -> None:
    # PostgreSQL cannot store NUL in text: it answered 500
    import pydantic

    from api.schemas import ProjectCreate

    with pytest.raises(pydantic.ValidationError):
        ProjectCreate.model_validate(body)
