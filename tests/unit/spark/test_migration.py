"""Taking over from the micro-batch job's checkpoint (spark/migration.py)."""

from __future__ import annotations

import json
from pathlib import Path

from spark.dedup import ProducerMark, encode_marks
from spark.dedup_state import PartitionMarks
from spark.migration import EARLIEST, last_committed, seed_marks, starting_offsets

TOPIC = "setu.p.t.ingest"


def batch(
    checkpoint: Path, number: int, offsets: dict[str, dict[str, int]], committed: bool
) -> None:
    (checkpoint / "offsets").mkdir(parents=True, exist_ok=True)
    (checkpoint / "commits").mkdir(parents=True, exist_ok=True)
    metadata = {"batchWatermarkMs": 0, "batchTimestampMs": 1, "conf": {}}
    (checkpoint / "offsets" / str(number)).write_text(
        f"v1\n{json.dumps(metadata)}\n{json.dumps(offsets)}"
    )
    if committed:
        (checkpoint / "commits" / str(number)).write_text('v1\n{"nextBatchWatermarkMs":0}')


def test_the_new_query_starts_where_the_last_committed_batch_ended(tmp_path: Path) -> None:
    batch(tmp_path, 0, {TOPIC: {"0": 5, "1": 3}}, committed=True)
    batch(tmp_path, 1, {TOPIC: {"0": 9, "1": 3}}, committed=True)
    # A batch written but never committed is read again (delivery skips what it wrote twice)
    batch(tmp_path, 2, {TOPIC: {"0": 12, "1": 7}}, committed=False)
    committed = last_committed(str(tmp_path))
    assert committed is not None
    assert (committed.batch, committed.offsets) == (1, {TOPIC: {0: 9, 1: 3}})
    # A partition added since, and a topic the old query never read, start at their first
    # offset; Spark wants every partition named
    other = "setu.p.u.ingest"
    assert json.loads(starting_offsets(committed, {TOPIC: 3, other: 1})) == {
        TOPIC: {"0": 9, "1": 3, "2": EARLIEST},
        other: {"0": EARLIEST},
    }


def test_a_checkpoint_without_a_committed_batch_starts_everything_at_the_first_offset(
    tmp_path: Path,
) -> None:
    batch(tmp_path, 0, {TOPIC: {"0": 5}}, committed=False)
    assert last_committed(str(tmp_path)) is None
    assert last_committed(str(tmp_path / "never-made")) is None
    assert json.loads(starting_offsets(None, {TOPIC: 1})) == {TOPIC: {"0": EARLIEST}}
    assert seed_marks(str(tmp_path), None) == []


def test_the_operator_is_seeded_with_the_marks_of_committed_batches_only(
    tmp_path: Path,
) -> None:
    marks = PartitionMarks(str(tmp_path))
    committed_marks = encode_marks({(TOPIC, "p"): ProducerMark({0: 7}, 100, 1)})
    marks.save(TOPIC, 0, 1, committed_marks)
    marks.save(TOPIC, 0, 2, encode_marks({(TOPIC, "p"): ProducerMark({0: 9}, 200, 1)}))
    batch(tmp_path, 1, {TOPIC: {"0": 9}}, committed=True)
    batch(tmp_path, 2, {TOPIC: {"0": 12}}, committed=False)
    assert seed_marks(str(tmp_path), last_committed(str(tmp_path))) == [(TOPIC, 0, committed_marks)]


def test_a_batch_committed_before_any_topic_existed_is_a_committed_batch_that_read_nothing(
    tmp_path: Path,
) -> None:
    # Given a batch as Spark commits it when the pattern matched no topic yet: its source's
    # offsets line is "-" (as the job's own checkpoint had after `setu dev up`, stopped before
    # any topic was made)
    (tmp_path / "offsets").mkdir()
    (tmp_path / "commits").mkdir()
    (tmp_path / "offsets" / "1").write_text('v1\n{"batchWatermarkMs":0,"conf":{}}\n-')
    (tmp_path / "commits" / "1").write_text('v2\n{"nextBatchWatermarkMs":0}')
    # Then it is the last committed batch, and every partition starts at its first offset
    committed = last_committed(str(tmp_path))
    assert committed is not None
    assert (committed.batch, committed.offsets) == (1, {})
    assert json.loads(starting_offsets(committed, {TOPIC: 1})) == {TOPIC: {"0": EARLIEST}}
