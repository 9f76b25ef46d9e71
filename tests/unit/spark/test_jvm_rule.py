"""The ingest job's JVM operator decides exactly as ``spark/dedup.py``'s rule does.

Random histories of one ingest partition (producers resending, clocks skewed backwards, topics
created again, message ids repeated within and beyond their window, bounds reached) go through
the Java rule (``setu.ingest.Replay`` over a py4j gateway) and through
:class:`spark.dedup_stream.RecordRule`, which runs :class:`spark.dedup_stream.PartitionStream`
one record at a time. Both must keep the same records and hold the same state, also across a
restart (a new rule over the stored state) and a seed from marks the micro-batch job stored.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from pyspark import SparkConf
from pyspark.java_gateway import launch_gateway

from cli import jvm
from setu.settings import Settings
from spark.dedup import NO_SEQUENCE, encode_marks
from spark.dedup_stream import NO_TIME, RecordRule

TOPIC = "setu.p.t.ingest"
PARTITION = 3
Replay = Callable[[list[dict[str, Any]], int, int, int], dict[str, Any]]


@pytest.fixture(scope="module")
def java_replay() -> Iterator[Replay]:
    jar = jvm.ingest_jar(Settings())
    gateway = launch_gateway(SparkConf().set("spark.driver.extraClassPath", str(jar)))
    replay = gateway.jvm.setu.ingest.Replay

    def run(history: list[dict[str, Any]], ttl: int, max_marks: int, max_ids: int) -> Any:
        return json.loads(replay.run(json.dumps(history), ttl, max_marks, max_ids))

    try:
        yield run
    finally:
        gateway.shutdown()


# U+FF21 sorts below U+1D538 by code point but above it in UTF-16 units.
producers = st.sampled_from(["a", "b", "c", "\uff21", "\U0001d538"])
records = st.fixed_dictionaries(
    {
        "producer": st.one_of(st.none(), producers),
        "sequence": st.integers(0, 6),
        "incarnation": st.sampled_from([0, 100, 200]),
        "step_ms": st.integers(-20, 60),
        "message_id": st.one_of(st.none(), st.sampled_from(["m1", "m2", "m3", "m4"])),
        "window_ms": st.sampled_from([0, 30, 90]),
    }
)
steps = st.one_of(
    records,
    records,
    records,
    records,
    st.sampled_from([{"restart": True}, {"seed": True}, {"snapshot": True}]),
)


def python_snapshot(rule: RecordRule) -> dict[str, Any]:
    return {
        "clock": rule.clock_ms,
        "marks": {
            producer: [
                mark.partitions.get(PARTITION, NO_SEQUENCE),
                mark.last_seen_ms,
                mark.incarnation,
            ]
            for (_, producer), mark in rule.judging().items()
        },
        "ids": {i: list(s) for i, s in rule.ids.items() if s[0] > rule.clock_ms},
    }


def seeded(rule: RecordRule) -> RecordRule:
    """What a partition starts from when seeded with ``rule``'s stored marks: those marks, a
    clock at their newest last sight, no message ids."""
    fresh = RecordRule(TOPIC, PARTITION, rule.ttl_ms, rule.max_marks, rule.max_ids)
    fresh.marks = dict(rule.marks)
    fresh.clock_ms = max((m.last_seen_ms for m in rule.marks.values()), default=NO_TIME)
    return fresh


def _record(producer: str | None, step_ms: int) -> dict[str, Any]:
    return {
        "producer": producer,
        "sequence": 1,
        "incarnation": 0,
        "step_ms": step_ms,
        "message_id": None,
        "window_ms": 0,
    }


@settings(max_examples=250, deadline=None)
# Two producers seen at the same time, one of them to forget: the smaller by code point goes.
@example([_record("\uff21", 0), _record("\U0001d538", 0), {"snapshot": True}], 100, 1, 1)
@given(
    st.lists(steps, max_size=40),
    st.integers(1, 120),
    st.integers(1, 4),
    st.integers(1, 4),
)
def test_the_jvm_rule_decides_as_the_reference_does(
    java_replay: Replay,
    history: list[dict[str, Any]],
    ttl_ms: int,
    max_marks: int,
    max_ids: int,
) -> None:
    rule = RecordRule(TOPIC, PARTITION, ttl_ms, max_marks, max_ids)
    clock = 1_000
    to_java: list[dict[str, Any]] = []
    keep: list[bool] = []
    snapshots: list[dict[str, Any]] = []
    for step in history:
        if "producer" in step:
            clock += step["step_ms"]
            record = [
                step["producer"],
                step["sequence"],
                step["incarnation"],
                clock,
                step["message_id"],
                step["window_ms"],
            ]
            keep.append(rule.admit(*record))
            to_java.append({"record": record})
        elif "seed" in step:
            to_java.append({"seed": encode_marks(rule.marks)})
            rule = seeded(rule)
        elif "snapshot" in step:
            snapshots.append(python_snapshot(rule))
            to_java.append(step)
        else:
            to_java.append(step)
    java = java_replay(to_java, ttl_ms, max_marks, max_ids)
    assert java["keep"] == keep
    assert java["snapshots"] == snapshots


def test_the_replay_sees_a_resent_sequence_as_a_duplicate(java_replay: Replay) -> None:
    """A sentinel for the property above: the JVM side is reached and decides."""
    history = [{"record": ["a", 1, 0, 10, None, 0]}, {"record": ["a", 1, 0, 11, None, 0]}]
    assert java_replay(history, 1_000, 4, 4)["keep"] == [True, False]
