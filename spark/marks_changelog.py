"""Producer marks from the changelog the ingest query writes, raised in Redis by the driver.

The de-duplication operator follows each record it keeps with the producer's new mark in that
ingest partition, and the query writes it to the compacted topic ``MARKS_TOPIC`` as the record
goes to its main log (:mod:`spark.stream`). :class:`MarksFollower`, a thread of the job's
driver, reads that topic from its start and raises each producer's mark in Redis (the highest
over its partitions, as ``GET .../producers/{id}`` answers it). It keeps every mark it read in
memory, so when Redis forgets them (its marker of holding every mark is gone) it publishes all
of them again and sets the marker: the pattern of the group-state changelog (decision 0007).

A mark is the partition's as the operator decided it, which a replay decides again the same
way; raising is max-guarded, so reading a mark twice, or late, never lowers one.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection, Mapping

from confluent_kafka import Consumer, KafkaError, TopicPartition

from spark.marks import MarkPublisher, ProducerHighs, TopicMarks, by_topic, merge_highs
from spark.stream import MARKS_TOPIC
from state.producer_marks import Mark

log = logging.getLogger(__name__)


def parse_entry(key: bytes, value: bytes) -> tuple[tuple[str, str], Mark] | None:
    """A changelog record as ((ingest topic, producer), (incarnation, sequence)); None if it is
    not one (the producer id may hold ``/``, the topic and partition do not)."""
    try:
        topic, _, producer = key.decode().split("/", 2)
        incarnation, sequence = value.decode().split(":")
        return (topic, producer), (int(incarnation), int(sequence))
    except (UnicodeDecodeError, ValueError):
        return None


class MarksFollower:
    """Tails ``MARKS_TOPIC`` on a thread (:meth:`start`, :meth:`stop`) and raises the marks in
    Redis through ``publisher``, every mark again when Redis forgot them. ``retired`` says which
    ingest topics were deleted: their marks are not published again."""

    def __init__(
        self,
        bootstrap: str,
        publisher: MarkPublisher,
        client_config: Mapping[str, str] | None = None,
        retired: Callable[[], Collection[str]] = frozenset,
    ) -> None:
        self._consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                **(client_config or {}),
                "group.id": "setu-ingest-marks",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "fetch.wait.max.ms": 10,
            }
        )
        self._publisher = publisher
        self._retired = retired
        self._known: ProducerHighs = {}
        self._stop = threading.Event()
        self._caught_up = threading.Event()
        self._thread = threading.Thread(target=self._run, name="marks-follower", daemon=True)

    def start(self) -> MarksFollower:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10)
        self._consumer.close()

    def caught_up(self, timeout_s: float) -> bool:
        """True once the follower read the changelog to where it ended when it started."""
        return self._caught_up.wait(timeout_s)

    def everything(self) -> TopicMarks:
        """Every mark read so far, but those of retired ingest topics."""
        retired = set(self._retired())
        return by_topic((o, m) for o, m in self._known.items() if o[0] not in retired)

    def _run(self) -> None:
        ends = self._assign_from_start()
        # Read but not yet in Redis. What was read before the changelog's end at the start is
        # published too: a follower that stopped may not have published its last marks.
        pending: ProducerHighs = {}
        while not self._stop.is_set():
            for message in self._consumer.consume(1000, timeout=0.2):
                error = message.error()
                if error is not None:
                    if error.code() != KafkaError._PARTITION_EOF:
                        log.warning("reading the producer marks changelog: %s", error)
                    continue
                entry = parse_entry(message.key() or b"", message.value() or b"")
                if entry is not None:
                    merge_highs(pending, dict([entry]))
            merge_highs(self._known, pending)
            if ends and not self._caught_up_to(ends):
                continue
            retired = set(self._retired())
            fresh = [(o, m) for o, m in pending.items() if o[0] not in retired]
            try:
                # Also checks that Redis still holds every mark, and publishes them all if not.
                self._publisher.publish(by_topic(fresh), self.everything)
            except Exception:
                # Redis stayed away past the publisher's patience: the next round tries again.
                log.exception("producer marks not published; trying again")
                continue
            pending = {}
            self._caught_up.set()

    def _assign_from_start(self) -> dict[int, int]:
        """Reads the changelog from its start; returns each partition's end offset now."""
        metadata = self._consumer.list_topics(MARKS_TOPIC, timeout=30).topics.get(MARKS_TOPIC)
        partitions = sorted(metadata.partitions) if metadata and metadata.partitions else [0]
        self._consumer.assign([TopicPartition(MARKS_TOPIC, p, 0) for p in partitions])
        ends = {}
        for p in partitions:
            _, high = self._consumer.get_watermark_offsets(TopicPartition(MARKS_TOPIC, p), 30)
            if high > 0:
                ends[p] = high
        return ends

    def _caught_up_to(self, ends: dict[int, int]) -> bool:
        for tp in self._consumer.position([TopicPartition(MARKS_TOPIC, p) for p in list(ends)]):
            if tp.offset >= ends[tp.partition]:
                del ends[tp.partition]
        return not ends
