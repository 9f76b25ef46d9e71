"""Replays: a subscription's messages of a time window delivered again (docs/replays.md).

A receiver that answered 2xx to messages it then failed to process (a bad deploy, a bug on its
side) needs them again: a window of time, some groups, or one message. A replay names what to
deliver again; the delivery worker that owns each partition of the subscription reads that
partition's main log over the window and calls the endpoint again with every message the
replay selects and the subscription's own filter lets through.

This module holds the record and the rules that need no I/O: which messages a replay selects,
the ``webhook-id`` of a replayed call, and the progress of one partition as it is stored.
"""

from __future__ import annotations

import dataclasses
import secrets
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from setu.envelope import Envelope
from setu.policies import Filter, accepts, filter_json, parse_filter

# How long after its end a replay's window may still find records in the main log: the main
# log's record time is when the ingest job wrote the message, a little after it was produced,
# and the window is of produce times. A message the ingest job writes later than this after
# the window's end is not replayed (docs/replays.md).
WRITE_SLACK_MS = 10_000
# What a progress view lists of the messages a replay could not deliver and of the groups it
# gave up on; the counts are complete.
LISTED = 100


class ReplayState(StrEnum):
    RUNNING = "running"
    CANCELLED = "cancelled"
    DONE = "done"


def new_replay_id() -> str:
    return "rp_" + secrets.token_hex(8)


def replay_webhook_id(message_id: str, replay_id: str) -> str:
    """The ``webhook-id`` of a replayed call: not the original's, so a receiver that drops
    repeated ids takes the replayed message, and the same for every attempt of one replay, so
    it can still drop a replayed call made twice."""
    return f"{message_id}.{replay_id}"


@dataclass(frozen=True, slots=True)
class Replay:
    """One replay of one subscription. ``to_ms`` is resolved: the request's end, or the time
    the replay was asked for, so messages produced after it are live traffic, not replayed."""

    id: str
    project: str
    subscription: str
    from_ms: int
    to_ms: int
    partitions: int
    rate_per_second: float
    created_at_ms: int
    group_ids: frozenset[str] | None = None
    message_ids: frozenset[str] | None = None
    filter: Filter | None = None
    state: ReplayState = ReplayState.RUNNING
    ended_at_ms: int | None = None

    def selects(self, envelope: Envelope) -> bool:
        """Whether this replay delivers ``envelope`` again (the subscription's own filter is
        applied beside it, by the worker)."""
        if not self.from_ms <= envelope.produced_at_ms <= self.to_ms:
            return False
        if self.message_ids is not None and envelope.message_id not in self.message_ids:
            return False
        if self.group_ids is not None and envelope.group_id not in self.group_ids:
            return False
        return accepts(self.filter, envelope)

    def spec_json(self) -> dict[str, Any]:
        """What was asked, as the API shows it and the store keeps it."""
        return {
            "from_ms": self.from_ms,
            "to_ms": self.to_ms,
            "group_ids": None if self.group_ids is None else sorted(self.group_ids),
            "message_ids": None if self.message_ids is None else sorted(self.message_ids),
            "filter": None if self.filter is None else filter_json(self.filter),
            "rate_per_second": self.rate_per_second,
        }


def spec_from_json(doc: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments of :class:`Replay` that :meth:`Replay.spec_json` wrote."""
    groups, ids, shape = doc.get("group_ids"), doc.get("message_ids"), doc.get("filter")
    return {
        "from_ms": int(doc["from_ms"]),
        "to_ms": int(doc["to_ms"]),
        "group_ids": None if groups is None else frozenset(groups),
        "message_ids": None if ids is None else frozenset(ids),
        "filter": None if shape is None else parse_filter(shape),
        "rate_per_second": float(doc["rate_per_second"]),
    }


@dataclass(slots=True)
class PartitionProgress:
    """Where a replay stands on one partition, as its owner stores it.

    The owner reads the main log in passes. ``next_offset`` is where reading goes on: every
    selected record below it is finished (delivered, failed, or set aside in ``deferred``).
    ``end_offset`` is where the window's records end (-1 until the first pass found it).
    A group whose failed state holds its live messages back (it is retrying, or parked in the
    DLQ) is not replayed past its head: its first selected offset goes into ``deferred`` and
    the pass leaves its records alone; once the group is healthy again a later pass reads the
    log from there for the groups it names (``passing``: group → offset; None in the first
    pass, empty between passes). ``read_to``: how far the first pass has counted records
    (``scanned``, ``matched``), so that reading again after a restart does not count twice.
    """

    next_offset: int
    end_offset: int
    scanned: int = 0
    matched: int = 0
    delivered: int = 0
    failed: int = 0
    skipped: int = 0
    deferred: dict[str, int] = field(default_factory=dict)
    passing: dict[str, int] | None = None
    read_to: int = 0
    failed_groups: list[str] = field(default_factory=list)
    failed_messages: list[str] = field(default_factory=list)
    done: bool = False

    def json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> PartitionProgress:
        """What :meth:`json` wrote (its JSON keeps every field's type)."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{name: value for name, value in doc.items() if name in names})


def progress_view(replay: Replay, parts: dict[int, PartitionProgress]) -> dict[str, Any]:
    """The progress the API shows: sums over the partitions started so far."""
    failed_messages: list[str] = []
    failed_groups: list[str] = []
    waiting: set[str] = set()
    totals = dict.fromkeys(("scanned", "matched", "delivered", "failed", "skipped"), 0)
    for _, part in sorted(parts.items()):
        for name in totals:
            totals[name] += getattr(part, name)
        failed_messages.extend(part.failed_messages)
        failed_groups.extend(part.failed_groups)
        waiting.update(part.deferred)
    return {
        **totals,
        "waiting_groups": len(waiting),
        "waiting_group_ids": sorted(waiting)[:LISTED],
        "failed_group_ids": failed_groups[:LISTED],
        "failed_message_ids": failed_messages[:LISTED],
        "partitions": replay.partitions,
        "partitions_started": len(parts),
        "partitions_done": sum(1 for part in parts.values() if part.done),
    }
