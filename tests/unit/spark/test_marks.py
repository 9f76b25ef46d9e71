"""Folding producer highs: any order and any repetition give the same marks."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import redis

from spark.marks import MarkPublisher, by_topic, merge_highs


def test_merge_keeps_the_highest_sequence_per_producer() -> None:
    into = {("t", "a"): (1, 5), ("t", "b"): (1, 1)}
    merge_highs(into, {("t", "a"): (1, 3), ("t", "b"): (1, 4), ("u", "a"): (1, 0)})
    assert into == {("t", "a"): (1, 5), ("t", "b"): (1, 4), ("u", "a"): (1, 0)}


def test_a_newer_topic_incarnation_wins_over_a_higher_sequence() -> None:
    # A late batch of a deleted topic and the first batch of the topic created again
    into = {("t", "a"): (1, 50)}
    merge_highs(into, {("t", "a"): (2, 3)})
    assert into == {("t", "a"): (2, 3)}
    merge_highs(into, {("t", "a"): (1, 60)})
    assert into == {("t", "a"): (2, 3)}


def test_highs_are_grouped_by_ingest_topic() -> None:
    highs = [(("setu.p.t.ingest", "a"), (1, 3)), (("setu.p.u.ingest", "a"), (2, 1))]
    assert by_topic(highs) == {"setu.p.t.ingest": {"a": (1, 3)}, "setu.p.u.ingest": {"a": (2, 1)}}


class FlakyRedis:
    """A client whose mark script fails ``failures`` times as a restarting Redis does."""

    def __init__(self, failures: list[Exception]) -> None:
        self.failures = failures
        self.calls: list[tuple[list[str], list[str | int]]] = []

    def register_script(self, script: str) -> Callable[..., None]:
        def run(keys: list[str], args: list[str | int]) -> None:
            if self.failures:
                raise self.failures.pop(0)
            self.calls.append((keys, args))

        return run


def test_publishing_marks_waits_out_a_redis_restart() -> None:
    # Given Redis refusing connections, then loading its data, then back
    client = FlakyRedis([redis.ConnectionError("refused"), redis.BusyLoadingError("loading")])
    slept: list[float] = []
    publisher = MarkPublisher(client, sleep=slept.append)  # type: ignore[arg-type]
    # When a batch's marks are published
    publisher.publish({"setu.p.t.ingest": {"p1": (5, 7)}})
    # Then they are, after two growing pauses, and the batch goes on
    assert client.calls == [(["setu:producers:{p.t}"], ["p1", 5, 7])]
    assert slept == [0.2, 0.4]


def test_publishing_marks_gives_up_once_redis_stays_away() -> None:
    client = FlakyRedis([redis.ConnectionError("refused")] * 100)
    publisher = MarkPublisher(client, patience_s=1.0, sleep=lambda s: None)  # type: ignore[arg-type]
    with pytest.raises(redis.ConnectionError):
        publisher.publish({"setu.p.t.ingest": {"p1": (5, 7)}})


class ForgetfulRedis(FlakyRedis):
    """A client whose Redis may have forgotten every mark (no 'loaded' marker)."""

    def __init__(self, loaded: bool) -> None:
        super().__init__([])
        self.keys: set[str] = {"setu:producers:loaded"} if loaded else set()

    def exists(self, key: str) -> int:
        return int(key in self.keys)

    def set(self, key: str, value: str) -> None:
        self.keys.add(key)


@pytest.mark.parametrize("loaded", [True, False])
def test_marks_redis_forgot_are_published_again_before_the_batchs(loaded: bool) -> None:
    # Given Redis with or without every mark the job knows
    client = ForgetfulRedis(loaded)
    publisher = MarkPublisher(client)  # type: ignore[arg-type]
    everything = {"setu.p.t.ingest": {"old": (5, 40)}}
    # When a batch publishes its own marks
    publisher.publish({"setu.p.t.ingest": {"p1": (5, 7)}}, lambda: everything)
    # Then a Redis that forgot gets everything first, and is marked as holding it all
    again = [(["setu:producers:{p.t}"], ["old", 5, 40])] if not loaded else []
    assert client.calls == [*again, (["setu:producers:{p.t}"], ["p1", 5, 7])]
    assert "setu:producers:loaded" in client.keys
