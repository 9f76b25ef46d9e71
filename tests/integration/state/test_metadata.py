"""The metadata store's contract, run on SQLite and on PostgreSQL."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
import sqlalchemy as sa

from setu.errors import Conflict, DependencyUnavailable, NotFound
from setu.model import (
    DeadLetterPolicy,
    Endpoint,
    EndpointTls,
    Notifications,
    OAuth2Credentials,
    Project,
    RetryPolicy,
    SigningSecret,
    Subscription,
    SubscriptionState,
    Topic,
)
from state import migrate
from state.lifecycle import LifecycleAction
from state.metadata import MetadataStore
from state.schema import notifications, subscriptions
from state.sealing import Sealer

pytestmark = pytest.mark.integration


@pytest.fixture
def store(database_url: str) -> Iterator[MetadataStore]:
    migrate.upgrade(database_url)
    store = MetadataStore(database_url, Sealer([Sealer.new_key()]))
    yield store
    store.close()


def subscription(**changes: object) -> Subscription:
    sub = Subscription(
        project="p",
        name="s",
        topic="t",
        endpoint=Endpoint("https://h/x", "PUT", (("Authorization", "Bearer a"),), 2_000),
        grouped=True,
        retry=RetryPolicy((100, 200), (500, 503)),
        dead_letter_policy=DeadLetterPolicy.SKIP,
        max_in_flight=9,
        rate_limit_per_second=2.5,
        signing_secrets=(SigningSecret("ss_a", "whsec_x", 1),),
    )
    return dataclasses.replace(sub, **changes)  # type: ignore[arg-type]


@pytest.fixture
def with_topic(store: MetadataStore) -> MetadataStore:
    store.create_project(Project("p"))
    store.create_topic(Topic("p", "t", grouped=True, partitions=3, retention_hours=5))
    return store


def test_project_create_is_idempotent_and_conflicts_on_a_different_body(
    store: MetadataStore,
) -> None:
    created, was_new = store.create_project(Project("p", "orders"))
    again, again_new = store.create_project(Project("p", "orders"))
    assert (was_new, again_new) == (True, False)
    assert again == created
    assert created.created_at_ms > 0
    with pytest.raises(Conflict):
        store.create_project(Project("p", "other"))


def test_projects_list_in_name_order_and_unknown_is_404(store: MetadataStore) -> None:
    for name in ("b", "a", "c"):
        store.create_project(Project(name))
    assert [p.name for p in store.list_projects()] == ["a", "b", "c"]
    with pytest.raises(NotFound):
        store.get_project("zz")
    with pytest.raises(NotFound):
        store.delete_project("zz")


def test_project_with_topics_cannot_be_deleted(with_topic: MetadataStore) -> None:
    with pytest.raises(Conflict, match="1 topic"):
        with_topic.delete_project("p")
    with_topic.mark_topic_deleting("p", "t")
    with_topic.delete_topic("p", "t")
    with_topic.delete_project("p")
    assert with_topic.list_projects() == []


def test_topic_round_trips_and_is_idempotent(with_topic: MetadataStore) -> None:
    stored = with_topic.get_topic("p", "t")
    assert dataclasses.replace(stored, created_at_ms=0) == Topic("p", "t", True, 3, 5)
    same, created = with_topic.create_topic(
        Topic("p", "t", grouped=True, partitions=3, retention_hours=5)
    )
    assert (same, created) == (stored, False)
    assert with_topic.preflight_topic(Topic("p", "t", True, 3, 5)) == stored
    assert with_topic.preflight_topic(Topic("p", "new")) is None


@pytest.mark.parametrize(
    "different",
    [{"grouped": False}, {"partitions": 4}, {"retention_hours": 6}],
)
def test_topic_with_a_different_spec_conflicts(
    with_topic: MetadataStore, different: dict[str, object]
) -> None:
    other = dataclasses.replace(Topic("p", "t", True, 3, 5), **different)  # type: ignore[arg-type]
    with pytest.raises(Conflict):
        with_topic.preflight_topic(other)
    with pytest.raises(Conflict):
        with_topic.create_topic(other)


def test_topic_in_unknown_project_is_404(store: MetadataStore) -> None:
    with pytest.raises(NotFound, match="project"):
        store.create_topic(Topic("nope", "t"))
    with pytest.raises(NotFound, match="project"):
        store.list_topics("nope")


def test_topic_being_deleted_is_hidden_and_blocks_recreation(with_topic: MetadataStore) -> None:
    # Given a topic whose deletion started (its Kafka topics are being removed)
    with_topic.mark_topic_deleting("p", "t")
    # Then reads no longer see it, and re-creating it must wait for the delete to finish
    assert with_topic.find_topic("p", "t") is None
    assert with_topic.list_topics("p") == []
    with pytest.raises(Conflict, match="being deleted"):
        with_topic.create_topic(Topic("p", "t", True, 3, 5))
    # When the delete is repeated and finished, the name is free again
    with_topic.mark_topic_deleting("p", "t")
    with_topic.delete_topic("p", "t")
    assert with_topic.create_topic(Topic("p", "t"))[1] is True


def test_topic_with_subscriptions_cannot_start_deleting(with_topic: MetadataStore) -> None:
    with_topic.create_subscription(subscription())
    with pytest.raises(Conflict, match="1 subscription"):
        with_topic.mark_topic_deleting("p", "t")
    assert with_topic.find_topic("p", "t") is not None


def test_subscription_round_trips_every_field(with_topic: MetadataStore) -> None:
    stored, created = with_topic.create_subscription(subscription())
    assert created
    assert stored.version == 1
    assert stored.state is SubscriptionState.RUNNING
    expected = dataclasses.replace(subscription(), created_at_ms=stored.created_at_ms)
    assert stored == expected
    assert with_topic.get_subscription("p", "s") == stored
    assert with_topic.list_subscriptions("p") == [stored]
    assert with_topic.list_subscriptions() == [stored]


def test_subscription_create_is_idempotent_and_conflicts_on_a_difference(
    with_topic: MetadataStore,
) -> None:
    with_topic.create_subscription(subscription())
    # Given the subscription was paused since
    with_topic.apply_lifecycle("p", "s", LifecycleAction.PAUSE)
    # Then the same body again returns it as it is now, and a different body conflicts
    again, created = with_topic.create_subscription(subscription())
    assert not created
    assert again.state is SubscriptionState.PAUSED
    with pytest.raises(Conflict):
        with_topic.create_subscription(subscription(max_in_flight=10))
    with pytest.raises(Conflict):
        with_topic.preflight_subscription(subscription(signing_secrets=()))


def test_subscription_needs_an_existing_topic(with_topic: MetadataStore) -> None:
    with pytest.raises(NotFound, match="topic"):
        with_topic.create_subscription(subscription(topic="missing"))


def test_update_bumps_version_and_refuses_a_stale_one(with_topic: MetadataStore) -> None:
    with_topic.create_subscription(subscription())
    changed = subscription(endpoint=Endpoint("https://other/y"), retry=RetryPolicy((1, 2, 3, 4)))
    updated = with_topic.update_subscription(changed, expected_version=1)
    assert updated.version == 2
    assert updated.endpoint.url == "https://other/y"
    assert updated.retry.tiers == 4
    with pytest.raises(Conflict, match="version 2"):
        with_topic.update_subscription(subscription(), expected_version=1)
    with pytest.raises(NotFound):
        with_topic.update_subscription(subscription(name="nope"), expected_version=1)


def test_concurrent_updates_with_one_version_let_exactly_one_win(
    with_topic: MetadataStore,
) -> None:
    with_topic.create_subscription(subscription())

    def update(n: int) -> str:
        try:
            with_topic.update_subscription(subscription(max_in_flight=n), expected_version=1)
        except Conflict:
            return "conflict"
        return "ok"

    with ThreadPoolExecutor(8) as pool:
        outcomes = list(pool.map(update, range(1, 9)))
    assert outcomes.count("ok") == 1
    assert with_topic.get_subscription("p", "s").version == 2


def test_concurrent_creates_of_one_project_all_succeed_once(store: MetadataStore) -> None:
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda _: store.create_project(Project("p", "d")), range(8)))
    assert sum(created for _, created in results) == 1
    assert len({project for project, _ in results}) == 1


def test_lifecycle_changes_state_but_not_version(with_topic: MetadataStore) -> None:
    with_topic.create_subscription(subscription())
    assert (
        with_topic.apply_lifecycle("p", "s", LifecycleAction.STOP).state
        is SubscriptionState.STOPPED
    )
    with pytest.raises(Conflict):
        with_topic.apply_lifecycle("p", "s", LifecycleAction.RESUME)
    assert (
        with_topic.apply_lifecycle("p", "s", LifecycleAction.START).state
        is SubscriptionState.RUNNING
    )
    assert with_topic.get_subscription("p", "s").version == 1
    with pytest.raises(NotFound):
        with_topic.apply_lifecycle("p", "nope", LifecycleAction.START)


def test_seek_needs_a_stopped_subscription_and_bumps_its_generation(
    with_topic: MetadataStore,
) -> None:
    with_topic.create_subscription(subscription())
    with pytest.raises(Conflict, match="stop"):
        with_topic.request_seek("p", "s", 1_000)
    with_topic.apply_lifecycle("p", "s", LifecycleAction.STOP)
    first = with_topic.request_seek("p", "s", 1_000)
    second = with_topic.request_seek("p", "s", 2_000)
    assert (first.seek_to_ms, first.seek_generation) == (1_000, 1)
    assert (second.seek_to_ms, second.seek_generation) == (2_000, 2)


def test_subscription_being_deleted_vanishes_for_workers(with_topic: MetadataStore) -> None:
    with_topic.create_subscription(subscription())
    with_topic.mark_subscription_deleting("p", "s")
    # Then workers polling the store stop seeing it, and so does every read
    assert with_topic.list_subscriptions() == []
    with pytest.raises(NotFound):
        with_topic.get_subscription("p", "s")
    with pytest.raises(Conflict, match="being deleted"):
        with_topic.create_subscription(subscription())
    # When the delete is repeated and finished, the name is free
    with_topic.mark_subscription_deleting("p", "s")
    with_topic.delete_subscription("p", "s")
    with pytest.raises(NotFound):
        with_topic.mark_subscription_deleting("p", "s")
    assert with_topic.create_subscription(subscription())[1] is True


def test_unreachable_database_is_503() -> None:
    store = MetadataStore(
        "postgresql+psycopg://nobody@127.0.0.1:1/none", Sealer([Sealer.new_key()])
    )
    try:
        with pytest.raises(DependencyUnavailable):
            store.ping()
        with pytest.raises(DependencyUnavailable):
            store.list_projects()
    finally:
        store.close()


def raw_subscriptions(store: MetadataStore) -> str:
    with store._tx() as conn:
        return str(conn.execute(sa.select(subscriptions)).all())


def test_secrets_are_sealed_at_rest_and_rotate_with_the_key(database_url: str) -> None:
    # Given a subscription with a header value and a signing secret, stored under key A
    migrate.upgrade(database_url)
    key_a, key_b = Sealer.new_key(), Sealer.new_key()
    store = MetadataStore(database_url, Sealer([key_a]))
    store.create_project(Project("p"))
    store.create_topic(Topic("p", "t", grouped=True, partitions=3, retention_hours=5))
    # and a client key and OAuth2 client secret (docs/security.md §4)
    access = dataclasses.replace(
        subscription().endpoint,
        tls=EndpointTls("CERT-PEM", "KEY-PEM-k3y", "CA-PEM"),
        oauth2=OAuth2Credentials("https://a.example.com/t", "c", "cs-s3cret", ("x",), None),
        proxy="corp",
    )
    store.create_subscription(dataclasses.replace(subscription(), endpoint=access))
    store.set_notifications(
        Notifications("p", "https://ops.example.com/e", ("group.parked",), "whsec_n")
    )
    # Then the rows hold none of the values
    raw = raw_subscriptions(store)
    for value in ("Bearer a", "whsec_x", "KEY-PEM-k3y", "cs-s3cret"):
        assert value not in raw, value
    with store._tx() as conn:
        assert "whsec_n" not in str(conn.execute(sa.select(notifications)).all())
    store.close()
    # When key B is put first and the secrets are sealed again
    both = MetadataStore(database_url, Sealer([key_b, key_a]))
    assert both.reseal_secrets() == 2
    both.close()
    # Then key B alone opens them
    only_b = MetadataStore(database_url, Sealer([key_b]))
    try:
        sub = only_b.get_subscription("p", "s")
        assert sub.endpoint == access
        assert sub.endpoint.headers == (("Authorization", "Bearer a"),)
        assert [s.value for s in sub.signing_secrets] == ["whsec_x"]
        assert only_b.get_notifications("p").signing_secret == "whsec_n"
    finally:
        only_b.close()


def test_a_rotation_holds_two_secrets_and_removing_one_ends_it(
    with_topic: MetadataStore,
) -> None:
    # Given a subscription with one secret
    sub, _ = with_topic.create_subscription(subscription())
    version = sub.version
    # When a new secret comes in with an hour of overlap
    new = SigningSecret("ss_b", "whsec_y", created_at_ms=1_000)
    rotated = with_topic.rotate_signing_secret("p", "s", new, 1_000 + 3_600_000)
    # Then both are held, the old one until the overlap ends, and the version is unchanged
    assert [(s.id, s.value, s.expires_at_ms) for s in rotated.signing_secrets] == [
        ("ss_b", "whsec_y", None),
        ("ss_a", "whsec_x", 1_000 + 3_600_000),
    ]
    assert rotated.version == version
    # And removing the old one ends the rotation; removing an unknown id is NotFound
    ended = with_topic.remove_signing_secret("p", "s", "ss_a")
    assert [s.id for s in ended.signing_secrets] == ["ss_b"]
    with pytest.raises(NotFound, match="ss_a"):
        with_topic.remove_signing_secret("p", "s", "ss_a")
    # And creating the same subscription again with the same secret value is idempotent
    again = dataclasses.replace(
        subscription(), signing_secrets=(SigningSecret("other-id", "whsec_y"),)
    )
    assert with_topic.create_subscription(again)[1] is False


def test_every_listing_of_all_subscriptions_shows_each_change_since_the_last(
    with_topic: MetadataStore,
) -> None:
    # A full listing reuses what it decoded for rows that did not change: every kind of
    # change must still show at the next one.
    store = with_topic
    store.create_subscription(subscription(name="a"))
    store.create_subscription(subscription(name="b"))
    first = {s.name: s for s in store.list_subscriptions()}
    assert set(first) == {"a", "b"}
    # When one is paused (its version stays), another's configuration is replaced, a third
    # is created and the first is marked for deletion
    store.apply_lifecycle("p", "a", LifecycleAction.PAUSE)
    changed = dataclasses.replace(first["b"], max_in_flight=3)
    store.update_subscription(changed, first["b"].version)
    store.create_subscription(subscription(name="c"))
    # Then the next full listing shows all of it
    second = {s.name: s for s in store.list_subscriptions()}
    assert second["a"].state is SubscriptionState.PAUSED
    assert second["b"].max_in_flight == 3
    assert set(second) == {"a", "b", "c"}
    store.mark_subscription_deleting("p", "a")
    assert {s.name for s in store.list_subscriptions()} == {"b", "c"}
    # And an unchanged row reads the same as a fresh decoding
    assert store.list_subscriptions()[0] == store.get_subscription("p", "b")
