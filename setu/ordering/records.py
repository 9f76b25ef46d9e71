"""One consumed Kafka record as delivery sees it, and the headers delivery adds to copies.

A copy written to a retry tier or the DLQ carries the message's envelope plus headers of
delivery's own: why it was written (``setu-kind``), where from (``setu-origin``, tier and
offset, so recovery can tell whether that move reached Redis), when it is due
(``setu-due-at``) and under which owner epoch of its partition (``setu-epoch``, so copies of
a worker that had lost the partition can be told apart; see :mod:`setu.ordering.fencing`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from setu.envelope import Envelope, KafkaHeaders
from setu.ordering.groups import Kind

H_KIND = "setu-kind"
H_ORIGIN = "setu-origin"
H_DUE_AT = "setu-due-at"
H_EPOCH = "setu-epoch"


@dataclass(frozen=True, slots=True)
class Record:
    """A message read from ``tier`` at ``offset`` of one partition index."""

    tier: int
    offset: int
    envelope: Envelope
    kind: Kind | None = None  # None for a main-log record
    origin: tuple[int, int] | None = None  # (tier, offset) this copy was made from
    due_at_ms: int = 0
    epoch: int | None = None  # the writer's owner epoch; None for a main record or older copy
    read_ms: int = 0  # when the worker read it (wall clock), 0 where unknown
    # A main record its group's state holds by reference (GroupState.held): it counts in tier
    # HOLD, and its main-log offset finished when it was held (docs/scheduling.md).
    held: bool = False

    @property
    def group(self) -> str | None:
        return self.envelope.group_id

    @property
    def message_id(self) -> str:
        return self.envelope.message_id


def copy_headers(
    envelope: Envelope, kind: Kind, origin: tuple[int, int], due_at_ms: int, epoch: int = 0
) -> KafkaHeaders:
    """Kafka headers of a copy of ``envelope`` (``epoch`` 0: written outside any ownership)."""
    headers = envelope.kafka_headers()
    headers.append((H_KIND, kind.value.encode()))
    headers.append((H_ORIGIN, f"{origin[0]}:{origin[1]}".encode()))
    headers.append((H_DUE_AT, str(due_at_ms).encode()))
    if epoch:
        headers.append((H_EPOCH, str(epoch).encode()))
    return headers


def parse_record(
    tier: int,
    offset: int,
    headers: Sequence[tuple[str, bytes | None]] | None,
    value: bytes | None,
    read_ms: int = 0,
) -> Record:
    """Rebuild a record; raises ValueError when it is not a Setu message."""
    envelope = Envelope.from_kafka(headers, value)
    kind: Kind | None = None
    origin: tuple[int, int] | None = None
    due = 0
    epoch: int | None = None
    for name, raw in headers or ():
        if name == H_KIND and raw is not None:
            kind = Kind(raw.decode())
        elif name == H_ORIGIN and raw is not None:
            left, _, right = raw.decode().partition(":")
            origin = (int(left), int(right))
        elif name == H_DUE_AT and raw is not None:
            due = int(raw)
        elif name == H_EPOCH and raw is not None:
            epoch = int(raw)
    return Record(tier, offset, envelope, kind, origin, due, epoch, read_ms)
