"""How many partitions one CreateTopics request asks for (state/kafka_admin.py)."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Sequence
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from setu.errors import DependencyUnavailable
from setu.model import Endpoint, Subscription, Topic
from state import kafka_admin
from state.kafka_admin import KafkaTopics, TopicSpec, by_partitions


def spec(name: str, partitions: int) -> TopicSpec:
    return TopicSpec(name, partitions, {})


def test_runs_stay_within_the_limit_in_order_and_an_oversized_topic_goes_alone() -> None:
    specs = [spec("a", 6), spec("b", 6), spec("c", 6), spec("big", 30), spec("d", 2)]
    runs = by_partitions(specs, 12)
    assert [[s.name for s in run] for run in runs] == [["a", "b"], ["c"], ["big"], ["d"]]
    assert [s for run in runs for s in run] == specs


def test_nothing_to_make_is_no_request() -> None:
    assert by_partitions([], 10) == []


class SlowKafka:
    """Topics that Kafka shows only after ``waits`` waits for them ran out (thousands of
    partitions made at once on a loaded broker): until then making them raises as the wait
    does, and they are not usable. Records the subscriptions made one at a time."""

    def __init__(self, admin: KafkaTopics, monkeypatch: pytest.MonkeyPatch, waits: int) -> None:
        self.waits = waits
        self.made: set[str] = set()
        self.alone: list[str] = []

        def make(specs: Sequence[TopicSpec], *, keep: bool = False) -> list[str]:
            self.made |= {s.name for s in specs}
            if self.waits > 0:
                self.waits -= 1
                raise DependencyUnavailable("Kafka topics did not appear in time")
            return [s.name for s in specs]

        def usable(specs: Sequence[TopicSpec]) -> set[str]:
            return set() if self.waits > 0 else {s.name for s in specs} & self.made

        def ensure_one(sub: Subscription, topic: Topic) -> list[str]:
            self.alone.append(sub.name)
            return []

        monkeypatch.setattr(admin, "_make", make)
        monkeypatch.setattr(admin, "_usable", usable)
        monkeypatch.setattr(admin, "_configure_all", lambda specs, skip_unknown: None)
        monkeypatch.setattr(admin, "ensure_subscription", ensure_one)


def subscriptions(n: int) -> list[tuple[Subscription, Topic]]:
    topic = Topic("p", "orders", partitions=3)
    return [(Subscription("p", f"s{i}", "orders", Endpoint("https://h")), topic) for i in range(n)]


def test_a_batch_kafka_is_slow_to_show_is_asked_again_whole_not_one_at_a_time(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Given three new subscriptions, and Kafka slow to show their topics once
    admin = KafkaTopics("127.0.0.1:1")
    kafka = SlowKafka(admin, monkeypatch, waits=1)
    # When they are ensured together
    outcomes = admin.ensure_subscriptions(subscriptions(3))
    # Then the batch is asked again and each is whole, none made one at a time
    assert list(outcomes.values()) == [None, None, None]
    assert "asking again" in caplog.text
    assert kafka.alone == []


def test_a_batch_kafka_stays_too_slow_for_fails_each_subscription_for_its_caller_to_retry(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given two new subscriptions, and Kafka too slow to show their topics every time
    admin = KafkaTopics("127.0.0.1:1")
    kafka = SlowKafka(admin, monkeypatch, waits=kafka_admin.BATCH_ATTEMPTS + 1)
    # When they are ensured together
    outcomes = admin.ensure_subscriptions(subscriptions(2))
    # Then each fails with Kafka's slowness (its caller tries again), none alone
    assert all(isinstance(o, DependencyUnavailable) for o in outcomes.values())
    assert kafka.alone == []
    # And once Kafka shows them, the next ask finds them whole
    kafka.waits = 0
    assert list(admin.ensure_subscriptions(subscriptions(2)).values()) == [None, None]


class MovingCoordinator:
    """An admin client whose group coordinator answers ``answers`` in turn to a delete (a
    broker just started, or its coordinator moved), then deletes the group."""

    def __init__(self, *answers: int) -> None:
        self.answers = list(answers)
        self.asked = 0

    def delete_consumer_groups(self, groups: list[str], **_: object) -> dict[str, Any]:
        self.asked += 1
        done: concurrent.futures.Future[None] = concurrent.futures.Future()
        if self.answers:
            done.set_exception(KafkaException(KafkaError(self.answers.pop(0))))
        else:
            done.set_result(None)
        return {groups[0]: done}


def test_a_group_delete_waits_out_a_coordinator_that_moves_or_loads() -> None:
    # A regression: a subscription's DELETE right after the broker started answered 503
    # ("Not coordinator") where asking again a moment later deletes it.
    admin = KafkaTopics("127.0.0.1:1", timeout_s=5)
    fake = MovingCoordinator(KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_LOAD_IN_PROGRESS)
    admin._admin = fake  # type: ignore[assignment]
    admin._delete_group("setu.sub.p.s")
    assert fake.asked == 3


def test_a_group_delete_still_fails_on_what_asking_again_does_not_mend() -> None:
    admin = KafkaTopics("127.0.0.1:1", timeout_s=5)
    fake = MovingCoordinator(KafkaError.GROUP_AUTHORIZATION_FAILED)
    admin._admin = fake  # type: ignore[assignment]
    with pytest.raises(DependencyUnavailable):
        admin._delete_group("setu.sub.p.s")
    assert fake.asked == 1
