"""The de-duplication step fed its rows in chunks, as Spark hands over a batch bounded in bytes:
the same rows cut into one chunk or many decide the same, and as the whole batch at once."""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from setu.tracing import MAX_LINKS
from spark.dedup import (
    ProducerKey,
    ProducerMark,
    decide_incarnated,
    decode_marks,
    encode_marks,
    least_recently_seen,
    live_marks,
)
from spark.dedup_state import PartitionMarks
from spark.marks import ProducerHighs, merge_highs
from spark.metrics import wait_counts
from spark.processor import PartitionDedup, partition_cap
from tests.unit.spark.accumulators import FakeCounts, FakeHighs, FakeTraces, FakeWaits

COLUMNS = [
    "topic",
    "partition",
    "offset",
    "value",
    "producer",
    "seq",
    "incarnation",
    "record_ms",
    "traceparent",
]
OUTPUT = ["topic", "partition", "offset", "value"]
BATCH = 5
TTL_MS = 60_000
MAX_PRODUCERS = 1000
Stored = dict[tuple[str, int], dict[ProducerKey, ProducerMark]]


@dataclass
class Outcome:
    """Everything a task's run leaves: rows handed on per partition, marks stored, the
    accumulators' values."""

    rows: dict[tuple[str, int], list[tuple[int, bytes]]]
    marks: dict[tuple[str, int], dict[ProducerKey, ProducerMark] | None]
    highs: Any
    counts: Any
    waits: Any
    traces: list[str]


def frame_of(rows: list[tuple[Any, ...]]) -> pd.DataFrame:
    """Rows (topic, partition, offset, producer, seq[, incarnation[, record_ms]])."""
    full = []
    for row in rows:
        topic, partition, offset, producer, seq, *rest = row
        incarnation, record_ms = [*rest, *(0, 1000)[len(rest) :]]
        trace = f"00-{offset:032x}-{partition:016x}-01"
        value = f"{topic}{partition}@{offset}".encode()
        full.append((topic, partition, offset, value, producer, seq, incarnation, record_ms, trace))
    return pd.DataFrame(full, columns=COLUMNS)


def run(
    root: Path, stored: Stored, frame: pd.DataFrame, cuts: list[int], ttl_ms: int = TTL_MS
) -> Outcome:
    """Runs a task of batch ``BATCH`` over ``frame`` cut before each position of ``cuts``, with
    ``stored`` as the marks of batch ``BATCH - 1``."""
    marks = PartitionMarks(str(root / uuid.uuid4().hex))
    for (topic, partition), saved in stored.items():
        marks.save(topic, partition, BATCH - 1, encode_marks(saved))
    highs, counts, waits, traces = FakeHighs(), FakeCounts(), FakeWaits(), FakeTraces()
    function = PartitionDedup(
        BATCH,
        marks,
        ttl_ms,
        MAX_PRODUCERS,
        OUTPUT,
        highs,  # type: ignore[arg-type]
        counts,  # type: ignore[arg-type]
        waits,  # type: ignore[arg-type]
        batch_started_ms=5000,
        traces=traces,  # type: ignore[arg-type]
    )
    chunks = [frame.iloc[a:b] for a, b in pairwise([0, *cuts, len(frame)])]
    out = list(function(iter(chunks)))
    rows: dict[tuple[str, int], list[tuple[int, bytes]]] = {}
    for part in out:
        for topic, partition, offset, value in part.itertuples(index=False, name=None):
            rows.setdefault((topic, partition), []).append((offset, value))
    keys = {(str(t), int(p)) for t, p in zip(frame["topic"], frame["partition"], strict=True)}
    saved = {}
    for topic, partition in sorted(keys):
        versions = marks.versions(topic, partition)
        loaded = marks.load(topic, partition, BATCH + 1)
        written = BATCH in versions
        saved[(topic, partition)] = decode_marks(loaded.text or "[]") if written else None
    counts_, total = waits.value
    return Outcome(rows, saved, highs.value, counts.value, (counts_, round(total, 6)), traces.value)


def whole_batch(
    stored: Stored, frame: pd.DataFrame, ttl_ms: int = TTL_MS
) -> tuple[dict[tuple[str, int], list[int]], dict[tuple[str, int], Any], ProducerHighs]:
    """The rule on each partition's whole batch at once (what the step did before it took
    chunks): kept offsets, stored marks and highs per partition."""
    kept: dict[tuple[str, int], list[int]] = {}
    saved: dict[tuple[str, int], Any] = {}
    highs: ProducerHighs = {}
    for (topic, partition), rows in frame.groupby(["topic", "partition"]):
        key = (str(topic), int(partition))
        rows = rows.sort_values("offset").reset_index(drop=True)
        if not rows["producer"].notna().any():
            kept[key], saved[key] = rows["offset"].tolist(), None
            continue
        now_ms = int(rows["record_ms"].max())
        known = live_marks(stored.get(key, {}), now_ms, ttl_ms)
        decision, batch_highs = decide_incarnated(rows, known, now_ms)
        marks = {o: m for o, m in known.items() if o not in decision.dropped} | decision.marks
        for producer in least_recently_seen(marks, partition_cap(MAX_PRODUCERS)):
            del marks[producer]
        kept[key] = rows["offset"][decision.keep].tolist()
        saved[key] = marks
        merge_highs(highs, batch_highs)
    return kept, saved, highs


def cuttings(length: int, seed: int) -> list[list[int]]:
    """Ways to cut ``length`` rows into chunks: none, every row, and a few at random."""
    rng = random.Random(seed)
    ways = [[], list(range(1, length))]
    for _ in range(3):
        ways.append(sorted(rng.sample(range(1, length), k=rng.randint(1, max(1, length // 3)))))
    return ways


def assert_same(outcomes: list[Outcome]) -> None:
    first = outcomes[0]
    for other in outcomes[1:]:
        assert other == first


def test_a_producers_sequence_cut_across_chunks_decides_as_one_chunk(tmp_path: Path) -> None:
    # Given p's sequences 0..9 on one partition, 4 and 7 sent twice
    seqs = [0, 1, 2, 3, 4, 4, 5, 6, 7, 7, 8, 9]
    frame = frame_of([("t", 0, i, "p", s) for i, s in enumerate(seqs)])
    # When the batch comes as one chunk, as one chunk per row, and cut right between resends
    outcomes = [run(tmp_path, {}, frame, cuts) for cuts in ([], list(range(1, 12)), [5, 9])]
    # Then every way keeps the same rows and stores the same marks
    assert_same(outcomes)
    assert [o for o, _ in outcomes[0].rows[("t", 0)]] == [0, 1, 2, 3, 4, 6, 7, 8, 10, 11]
    assert outcomes[0].marks[("t", 0)] == {("t", "p"): ProducerMark({0: 9}, 1000)}
    assert outcomes[0].highs == {("t", "p"): (0, 9)}
    assert outcomes[0].counts == {"t": (10, 2)}


def test_resends_in_later_chunks_are_judged_against_earlier_chunks(tmp_path: Path) -> None:
    # Given p at 3 in the stored marks, and a batch resending 2..4 and sending 5 twice, in
    # chunks that each end before a resend
    stored: Stored = {("t", 0): {("t", "p"): ProducerMark({0: 3}, 900)}}
    frame = frame_of([("t", 0, i, "p", s) for i, s in enumerate([2, 4, 3, 4, 5, 5, 4])])
    outcomes = [run(tmp_path, stored, frame, cuts) for cuts in ([], [1, 2, 3, 4, 5, 6], [2, 5])]
    # Then only the first 4 and the first 5 pass, whatever the chunks
    assert_same(outcomes)
    assert [o for o, _ in outcomes[0].rows[("t", 0)]] == [1, 4]
    assert outcomes[0].marks[("t", 0)] == {("t", "p"): ProducerMark({0: 5}, 1000)}


def test_two_partitions_interleaved_in_a_task_keep_their_own_marks(tmp_path: Path) -> None:
    # Given two partitions of t and one of u, their rows interleaved in the task (each in
    # offset order), p and q writing to each, with resends, one partition anonymous only
    rows = []
    for i in range(8):
        rows.append(("t", 0, 10 + i, "p", i // 2))
        rows.append(("t", 1, 20 + i, "q" if i % 3 else "p", i))
        rows.append(("u", 0, i, None, -1))
    frame = frame_of(rows)
    # When it comes in chunks cut every way
    outcomes = [run(tmp_path, {}, frame, cuts) for cuts in cuttings(len(frame), seed=1)]
    # Then every partition keeps the same rows in the same order and stores the same marks,
    # and the partition without producers stores none
    assert_same(outcomes)
    assert [o for o, _ in outcomes[0].rows[("t", 0)]] == [10, 12, 14, 16]
    assert outcomes[0].marks[("u", 0)] is None
    assert outcomes[0].counts == {"t": (12, 4), "u": (8, 0)}
    assert len(outcomes[0].traces) == 24


def random_batch(seed: int) -> tuple[Stored, pd.DataFrame]:
    """Stored marks and a batch of three partitions (rows interleaved, each in offset order):
    producers with resends, anonymous rows, a mark long expired, record times out of order."""
    rng = random.Random(seed)
    stored: Stored = {}
    per_partition: list[list[tuple[Any, ...]]] = []
    for topic, partition in [("t", 0), ("t", 1), ("u", 2)]:
        marks = {
            (topic, p): ProducerMark({partition: rng.randint(-1, 6)}, rng.randint(0, 900), 3)
            for p in rng.sample(["a", "b", "c", "d"], k=rng.randint(0, 3))
        }
        marks[(topic, "old")] = ProducerMark({partition: 50}, -TTL_MS, 3)
        stored[(topic, partition)] = marks
        nexts: dict[str, int] = {}
        rows = []
        for offset in range(rng.randint(0, 25)):
            record_ms = rng.randint(1000, 1500)
            producer = rng.choice(["a", "b", "c", "d", "old", None])
            if producer is None:
                rows.append((topic, partition, offset, None, -1, 0, record_ms))
                continue
            seq = nexts.get(producer, rng.randint(0, 4))
            nexts[producer] = seq + 1
            if rng.random() < 0.3:  # a resend of something sent before
                seq = rng.randint(0, seq)
            rows.append((topic, partition, offset, producer, seq, 3, record_ms))
        per_partition.append(rows)
    merged: list[tuple[Any, ...]] = []
    while any(per_partition):
        merged.append(rng.choice([r for r in per_partition if r]).pop(0))
    return stored, frame_of(merged)


@pytest.mark.parametrize("seed", range(12))
def test_any_cutting_decides_as_the_whole_batch(tmp_path: Path, seed: int) -> None:
    # Given a random batch in which no stored mark expires or is superseded midway
    stored, frame = random_batch(seed)
    # When it is cut into chunks every way
    outcomes = [run(tmp_path, stored, frame, cuts) for cuts in cuttings(len(frame), seed)]
    # Then each way keeps, stores and counts the same, and exactly what the rule on the whole
    # batch at once does
    assert_same(outcomes)
    kept, saved, highs = whole_batch(stored, frame)
    assert {k: [o for o, _ in v] for k, v in outcomes[0].rows.items()} == {
        k: v for k, v in kept.items() if v
    }
    assert outcomes[0].marks == saved
    assert outcomes[0].highs == highs
    # And the first traceparents in log order, and the waits, are the whole batch's
    rank = pd.factorize(frame["topic"])[0]
    in_order = frame.assign(rank=rank).sort_values(["rank", "partition", "offset"])
    assert outcomes[0].traces == in_order["traceparent"].head(MAX_LINKS).tolist()
    counts, total = wait_counts((5000 - frame["record_ms"].to_numpy()) / 1000)
    assert outcomes[0].waits == (counts, pytest.approx(total))


def test_a_mark_that_expires_midway_judges_the_rows_before_it_expired(tmp_path: Path) -> None:
    # Given p at 5, last seen at 1000, with a 3 s TTL
    stored: Stored = {("t", 0): {("t", "p"): ProducerMark({0: 5}, 1000)}}
    # When a batch resends 5 in a record of time 3000 (the mark still live) and again in one
    # of time 4000 (the mark idle for the TTL)
    frame = frame_of([("t", 0, 0, "p", 5, 0, 3000), ("t", 0, 1, "p", 4, 0, 4000)])
    outcomes = [run(tmp_path, stored, frame, cuts, ttl_ms=3000) for cuts in ([], [1])]
    # Then the first is a duplicate, the second is judged without the expired mark but against
    # the batch's own 5, and the stored mark starts over from the batch's rows
    assert_same(outcomes)
    assert outcomes[0].rows == {}
    assert outcomes[0].marks[("t", 0)] == {("t", "p"): ProducerMark({0: 5}, 4000)}
    assert outcomes[0].counts == {"t": (0, 2)}


def test_a_newer_incarnation_midway_drops_the_old_marks_from_its_first_message(
    tmp_path: Path,
) -> None:
    # Given p at 5 under incarnation 1 of t
    stored: Stored = {("t", 0): {("t", "p"): ProducerMark({0: 5}, 1000, 1)}}
    # When a batch has p resend 5 under incarnation 1, then t's new life (incarnation 2)
    # starts with q and r
    frame = frame_of([("t", 0, 0, "p", 5, 1), ("t", 0, 1, "q", 0, 2), ("t", 0, 2, "r", 0, 2)])
    outcomes = [run(tmp_path, stored, frame, cuts) for cuts in ([], [1], [1, 2])]
    # Then the resend is a duplicate of the old life, the new life's messages pass, and every
    # stored mark is of the new life
    assert_same(outcomes)
    assert [o for o, _ in outcomes[0].rows[("t", 0)]] == [1, 2]
    assert outcomes[0].marks[("t", 0)] == {
        ("t", "p"): ProducerMark({0: 5}, 1000, 2),
        ("t", "q"): ProducerMark({0: 0}, 1000, 2),
        ("t", "r"): ProducerMark({0: 0}, 1000, 2),
    }
    assert outcomes[0].highs == {("t", "q"): (2, 0), ("t", "r"): (2, 0)}


def test_rows_of_a_partition_out_of_order_across_chunks_fail_the_task(tmp_path: Path) -> None:
    frame = frame_of([("t", 0, 5, "p", 0), ("t", 0, 4, "p", 1)])
    with pytest.raises(RuntimeError, match="out of offset order"):
        run(tmp_path, {}, frame, [1])
