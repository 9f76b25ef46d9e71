"""Folding producer highs: any order and any repetition give the same marks."""

from __future__ import annotations

from spark.marks import HighsParam, by_topic, merge_highs


def test_merge_keeps_the_highest_sequence_per_producer() -> None:
    into = {("t", "a"): 5, ("t", "b"): 1}
    merge_highs(into, {("t", "a"): 3, ("t", "b"): 4, ("u", "a"): 0})
    assert into == {("t", "a"): 5, ("t", "b"): 4, ("u", "a"): 0}


def test_accumulator_is_indifferent_to_retried_tasks() -> None:
    # Given a task's highs added twice (a retried task), in either order
    param = HighsParam()
    task = {("t", "a"): 7}
    once = param.addInPlace(param.zero({}), task)
    twice = param.addInPlace(param.addInPlace(param.zero({}), task), dict(task))
    assert once == twice == {("t", "a"): 7}


def test_highs_are_grouped_by_ingest_topic() -> None:
    highs = [(("setu.p.t.ingest", "a"), 3), (("setu.p.u.ingest", "a"), 1)]
    assert by_topic(highs) == {"setu.p.t.ingest": {"a": 3}, "setu.p.u.ingest": {"a": 1}}
