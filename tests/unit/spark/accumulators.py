"""In-memory stand-ins for the ingest job's Spark accumulators (spark/metrics.py,
spark/marks.py): each adds as its accumulator's ``addInPlace`` does."""

from __future__ import annotations

from dataclasses import dataclass, field

from setu.tracing import MAX_LINKS
from spark.marks import ProducerHighs, merge_highs
from spark.metrics import TopicCounts, WaitCounts, add_counts, no_waits


@dataclass
class FakeHighs:
    value: ProducerHighs = field(default_factory=dict)

    def add(self, highs: ProducerHighs) -> None:
        merge_highs(self.value, highs)


@dataclass
class FakeCounts:
    value: TopicCounts = field(default_factory=dict)

    def add(self, counts: TopicCounts) -> None:
        add_counts(self.value, counts)


@dataclass
class FakeWaits:
    value: WaitCounts = field(default_factory=no_waits)

    def add(self, waits: WaitCounts) -> None:
        self.value = (
            [a + b for a, b in zip(self.value[0], waits[0], strict=True)],
            (self.value[1] + waits[1]),
        )


@dataclass
class FakeTraces:
    value: list[str] = field(default_factory=list)

    def add(self, traces: list[str]) -> None:
        self.value.extend(traces[: max(0, MAX_LINKS - len(self.value))])
