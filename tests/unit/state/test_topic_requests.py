"""How many partitions one CreateTopics request asks for (state/kafka_admin.py)."""

from __future__ import annotations

from state.kafka_admin import TopicSpec, by_partitions


def spec(name: str, partitions: int) -> TopicSpec:
    return TopicSpec(name, partitions, {})


def test_runs_stay_within_the_limit_in_order_and_an_oversized_topic_goes_alone() -> None:
    specs = [spec("a", 6), spec("b", 6), spec("c", 6), spec("big", 30), spec("d", 2)]
    runs = by_partitions(specs, 12)
    assert [[s.name for s in run] for run in runs] == [["a", "b"], ["c"], ["big"], ["d"]]
    assert [s for run in runs for s in run] == specs


def test_nothing_to_make_is_no_request() -> None:
    assert by_partitions([], 10) == []
