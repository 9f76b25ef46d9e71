"""From the micro-batch job's checkpoint to the operator query's (decision 0008, "Migration").

The operator query cannot resume the micro-batch query's checkpoint: its plan has a stateful
operator the old one lacks. So it starts a checkpoint of its own, and takes over where the old
query stopped with nothing lost and nothing doubled:

- **Offsets.** It starts each ingest partition at the end of the old query's last *committed*
  batch (the batch's entry in ``offsets/``; a batch is committed once ``commits/`` has it),
  and a partition the old query never read at its first offset. A batch that the old query
  wrote but did not commit is read again: its records reach the main log a second time, in
  the same order with the same ingest offsets, and delivery skips them as it skips any replay
  (``delivery/replays.py``).
- **De-duplication state.** Each partition's operator state is seeded from the newest marks
  the old query stored below its first uncommitted batch (``dedup/``,
  :mod:`spark.dedup_state`), which are the marks its committed batches left.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from pyarrow import fs as pafs

from spark.dedup_state import PartitionMarks, checkpoint_fs

EARLIEST = -2
"""The Kafka source's ``startingOffsets`` value for a partition's first offset."""

NO_OFFSETS = "-"
"""A source's line in a batch's ``offsets/`` entry when it had no offsets: Spark writes it for
a Kafka source whose pattern matched no topic yet (a job started before any topic existed)."""


@dataclass(frozen=True, slots=True)
class Committed:
    """Where the old query's last committed batch ended."""

    batch: int
    offsets: dict[str, dict[int, int]]
    """Ingest topic -> partition -> the next offset to read."""


def last_committed(checkpoint: str) -> Committed | None:
    """The old query's last committed batch, None when it committed none."""
    fs, root = checkpoint_fs(checkpoint.rstrip("/"))
    commits = [
        int(info.base_name)
        for info in fs.get_file_info(pafs.FileSelector(f"{root}/commits", allow_not_found=True))
        if info.base_name.isdigit()
    ]
    if not commits:
        return None
    batch = max(commits)
    with fs.open_input_stream(f"{root}/offsets/{batch}") as stream:
        lines = stream.read().decode().splitlines()
    # "v1", the batch's metadata, then one line per source: the job has one, the Kafka source.
    if len(lines) < 3:
        raise ValueError(f"{root}/offsets/{batch} has no source offsets")
    if lines[2] == NO_OFFSETS:
        return Committed(batch, {})  # no ingest topic existed yet: nothing was read
    source: dict[str, dict[str, int]] = json.loads(lines[2])
    offsets = {t: {int(p): int(o) for p, o in parts.items()} for t, parts in source.items()}
    return Committed(batch, offsets)


def starting_offsets(committed: Committed | None, partitions: Mapping[str, int]) -> str:
    """The new query's ``startingOffsets`` for the ingest topics it reads now (topic ->
    partition count): each partition where the old query's committed batches ended, else its
    first offset. Spark wants every partition the query subscribes to named."""
    known = committed.offsets if committed is not None else {}
    chosen = {
        topic: {str(p): known.get(topic, {}).get(p, EARLIEST) for p in range(partitions[topic])}
        for topic in sorted(partitions)
    }
    return json.dumps(chosen, separators=(",", ":"))


def seed_marks(checkpoint: str, committed: Committed | None) -> list[tuple[str, int, str]]:
    """(ingest topic, partition, marks) to seed the operator with: what the old query's
    committed batches left in each partition (none when it committed nothing)."""
    if committed is None:
        return []
    return PartitionMarks(checkpoint).partitions_below(committed.batch + 1)
