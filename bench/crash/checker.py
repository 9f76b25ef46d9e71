"""The crash test's verdict: a pure function of the producer's and the receiver's journals.

Inputs are the published records (in publish order; ``acked`` when the produce call got a 2xx,
else *optional*: sent before a kill, maybe in Setu, maybe not) and every webhook call in the
order the receiver journalled it. A message is *delivered* by its first 2xx call.

Checks, each a count that must be 0:

- ``lost``: acknowledged messages never delivered.
- ``out_of_order_groups``: groups whose delivered messages, in first-2xx order, are not in
  published order. Under the ``park`` policy every dead-lettered message is delivered after the
  unsideline, so the expected order is the full published order (optional messages that never
  arrived are left out).
- ``early_calls``: calls (any status) of a message made before an earlier message of its group,
  one that was eventually delivered, had been delivered (docs/design.md §3: "b is never sent
  before a has been delivered"). The receiver journals a 2xx before answering it, so journal
  order is a safe stand-in for time.
- ``corrupt_calls``: calls whose body hash or ``X_GROUP_ID`` differ from what was published.
- ``unknown_calls``: calls for a message id that was never published.
- ``webhook_id_mismatches``: calls whose ``webhook-id`` is not the message id.
- ``bad_signatures``: calls whose ``webhook-signature`` does not verify.
- ``id_distinct_duplicates``: extra deliveries left after a receiver drops repeated
  ``webhook-id``s, i.e. per message the distinct ``webhook-id``s among its 2xx calls, minus one.
- ``short_budget_dead_letters``: messages the DLQ holds as failed (not parked behind their
  group) after fewer than N+1 attempts although their last answer was retryable: every message
  keeps its own retry budget (docs/delivery.md). The DLQ is read at the end of the run.
- ``calls_before_their_time``: calls of a scheduled message (``X_DELIVER_AT``) the receiver took
  before that time (docs/scheduling.md).

Reported, not judged: ``raw_duplicates`` (2xx calls beyond the first per message; docs/design.md §3
allows these at the HTTP boundary after a crash) and call counts by status.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bench.crash.journal import Entry

EXAMPLES = 10
MUST_BE_ZERO = (
    "lost",
    "out_of_order_groups",
    "early_calls",
    "corrupt_calls",
    "unknown_calls",
    "webhook_id_mismatches",
    "bad_signatures",
    "id_distinct_duplicates",
    "short_budget_dead_letters",
    "calls_before_their_time",
)


@dataclass(frozen=True, slots=True)
class Published:
    message_id: str
    group_id: str
    payload_hash: str
    acked: bool


@dataclass(frozen=True, slots=True)
class Call:
    message_id: str
    group_id: str
    webhook_id: str
    status: int
    payload_hash: str
    signature_ok: bool | None = None
    at_ms: int = 0  # when the receiver took it
    deliver_at_ms: int = 0  # the time its producer chose (X_DELIVER_AT), 0: none

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A record of the DLQ written because its message failed (not one parked behind it)."""

    message_id: str
    group_id: str
    attempts: int
    last_status: int | None
    retryable: bool  # whether the last failure (status or no answer) was a retryable one


def published_from_journal(entries: Iterable[Entry]) -> list[Published]:
    """Records in publish order (order of first ``sent``), each marked acked or optional."""
    sent: dict[str, Entry] = {}
    acked: set[tuple[str, int]] = set()
    for entry in entries:
        if entry["e"] == "sent":
            sent.setdefault(entry["mid"], entry)
        elif entry["e"] == "ack":
            acked.add((entry["pid"], int(entry["seq"])))
    return [
        Published(e["mid"], e["gid"], e["hash"], (e["pid"], int(e["seq"])) in acked)
        for e in sent.values()
    ]


def calls_from_journal(entries: Iterable[Entry]) -> list[Call]:
    return [
        Call(
            e["mid"],
            e["gid"],
            e["wid"],
            int(e["status"]),
            e["hash"],
            e.get("sig"),
            int(e.get("t", 0)),
            int(e.get("dat", 0)),
        )
        for e in entries
    ]


def _examples(items: Iterable[Any]) -> Any:
    """The first few items; for a mapping, its first few entries."""
    if isinstance(items, dict):
        return dict(list(items.items())[:EXAMPLES])
    out: list[Any] = []
    for item in items:
        if len(out) == EXAMPLES:
            break
        out.append(item)
    return out


def check(
    published: Sequence[Published],
    calls: Sequence[Call],
    dead_letters: Sequence[DeadLetter] = (),
    retry_tiers: int = 0,
    flaky_groups: Iterable[str] = (),
) -> dict[str, Any]:
    """Judge one run; the result is JSON-ready and ``result["ok"]`` is the verdict.
    ``retry_tiers`` is the subscription's N; ``flaky_groups`` are the plan's groups whose
    messages fail a few calls each and then succeed (reported on their own)."""
    by_id = {p.message_id: p for p in published}
    order: dict[str, list[str]] = defaultdict(list)
    for p in published:
        order[p.group_id].append(p.message_id)
    position = {mid: i for mids in order.values() for i, mid in enumerate(mids)}

    ok_calls: Counter[str] = Counter()
    ok_webhook_ids: dict[str, set[str]] = defaultdict(set)
    first_ok: list[str] = []
    for call in calls:
        if call.ok and call.message_id in by_id:
            if call.message_id not in ok_calls:
                first_ok.append(call.message_id)
            ok_calls[call.message_id] += 1
            ok_webhook_ids[call.message_id].add(call.webhook_id)

    lost = [p.message_id for p in published if p.acked and p.message_id not in ok_calls]
    disordered = _disordered_groups(first_ok, by_id, order)
    early = _early_calls(calls, by_id, order, position, set(ok_calls))
    corrupt = [
        c.message_id
        for c in calls
        if c.message_id in by_id
        and (
            c.payload_hash != by_id[c.message_id].payload_hash
            or c.group_id != by_id[c.message_id].group_id
        )
    ]
    unknown = [c.message_id for c in calls if c.message_id not in by_id]
    mismatched = [c.message_id for c in calls if c.webhook_id != c.message_id]
    bad_signatures = [c.message_id for c in calls if c.signature_ok is False]
    id_distinct = {mid: len(ids) - 1 for mid, ids in ok_webhook_ids.items() if len(ids) > 1}
    raw = {mid: n - 1 for mid, n in ok_calls.items() if n > 1}
    short_budget = sorted(
        {d.message_id for d in dead_letters if d.retryable and d.attempts < retry_tiers + 1}
    )
    flaky = set(flaky_groups)
    too_soon = [c.message_id for c in calls if c.at_ms < c.deliver_at_ms]

    counts = {
        "lost": len(lost),
        "out_of_order_groups": len(disordered),
        "early_calls": len(early),
        "corrupt_calls": len(corrupt),
        "unknown_calls": len(unknown),
        "webhook_id_mismatches": len(mismatched),
        "bad_signatures": len(bad_signatures),
        "id_distinct_duplicates": sum(id_distinct.values()),
        "short_budget_dead_letters": len(short_budget),
        "calls_before_their_time": len(too_soon),
    }
    status_classes = Counter(f"{c.status // 100}xx" for c in calls)
    return {
        "ok": not any(counts.values()),
        "violations": [name for name in MUST_BE_ZERO if counts[name]],
        **counts,
        "raw_duplicates": sum(raw.values()),
        "published": len(published),
        "accepted": sum(p.acked for p in published),
        "optional": sum(not p.acked for p in published),
        "optional_delivered": sum(not p.acked and p.message_id in ok_calls for p in published),
        "delivered": len(ok_calls),
        "groups": len(order),
        "calls": len(calls),
        "calls_by_status": {name: status_classes[name] for name in sorted(status_classes)},
        "messages_rejected_4xx": len({c.message_id for c in calls if 400 <= c.status < 500}),
        "messages_failed_5xx": len({c.message_id for c in calls if c.status >= 500}),
        "dead_letters": len(dead_letters),
        "scheduled_delivered": len({c.message_id for c in calls if c.deliver_at_ms and c.ok}),
        "flaky_groups": len(flaky),
        "flaky_messages": sum(1 for p in published if p.group_id in flaky),
        "flaky_messages_dead_lettered": len(
            {d.message_id for d in dead_letters if d.group_id in flaky and d.retryable}
        ),
        "examples": {
            "lost": _examples(lost),
            "out_of_order_groups": _examples(disordered),
            "early_calls": _examples(early),
            "corrupt_calls": _examples(corrupt),
            "unknown_calls": _examples(unknown),
            "webhook_id_mismatches": _examples(mismatched),
            "bad_signatures": _examples(bad_signatures),
            "id_distinct_duplicates": _examples(id_distinct),
            "raw_duplicates": _examples(raw),
            "short_budget_dead_letters": _examples(short_budget),
            "calls_before_their_time": _examples(too_soon),
        },
    }


def _disordered_groups(
    first_ok: list[str], by_id: dict[str, Published], order: dict[str, list[str]]
) -> list[str]:
    delivered_order: dict[str, list[str]] = defaultdict(list)
    for mid in first_ok:
        delivered_order[by_id[mid].group_id].append(mid)
    bad = []
    for group, got in delivered_order.items():
        delivered = set(got)
        expected = [mid for mid in order[group] if mid in delivered]
        if got != expected:
            bad.append(group)
    return sorted(bad)


def _early_calls(
    calls: Sequence[Call],
    by_id: dict[str, Published],
    order: dict[str, list[str]],
    position: dict[str, int],
    eventually_delivered: set[str],
) -> list[str]:
    """Message ids of calls made while an earlier, eventually delivered message was pending."""
    # Per group: positions (in publish order) of the messages that are eventually delivered,
    # and how many of those, counted from the front, are delivered so far.
    needed = {
        group: [i for i, mid in enumerate(mids) if mid in eventually_delivered]
        for group, mids in order.items()
    }
    frontier: Counter[str] = Counter()
    delivered: set[str] = set()
    early = []
    for call in calls:
        if call.message_id not in by_id:
            continue
        group = by_id[call.message_id].group_id
        mids, wanted = order[group], needed[group]
        done = frontier[group]
        if done < len(wanted) and wanted[done] < position[call.message_id]:
            early.append(call.message_id)
        if call.ok and call.message_id not in delivered:
            delivered.add(call.message_id)
            while done < len(wanted) and mids[wanted[done]] in delivered:
                done += 1
            frontier[group] = done
    return early


# Figures of what was published: the same for every subscription of a run.
PER_RUN = ("published", "accepted", "optional", "groups", "flaky_groups", "flaky_messages")


def check_each(
    published: Sequence[Published],
    calls: Mapping[str, Sequence[Call]],
    dead_letters: Mapping[str, Sequence[DeadLetter]],
    retry_tiers: int = 0,
    flaky_groups: Iterable[str] = (),
) -> dict[str, Any]:
    """Judge a run whose topic has several subscriptions, each one on its own (``calls`` and
    ``dead_letters`` by subscription; a subscription with no call at all is in ``calls`` with
    none). Counts are summed over the subscriptions; ``failing_subscriptions`` names the ones
    that broke a rule, with their nonzero counts, and ``examples`` are the first of them."""
    flaky = list(flaky_groups)
    reports = {
        name: check(published, made, dead_letters.get(name, ()), retry_tiers, flaky)
        for name, made in calls.items()
    }
    if len(reports) == 1:
        return next(iter(reports.values()))
    first = next(iter(reports.values()))
    total: dict[str, Any] = {name: first[name] for name in PER_RUN}
    statuses: Counter[str] = Counter()
    for report in reports.values():
        statuses.update(report["calls_by_status"])
        for name, value in report.items():
            if name not in PER_RUN and type(value) is int:
                total[name] = total.get(name, 0) + value
    failing = {
        name: {k: report[k] for k in MUST_BE_ZERO if report[k]}
        for name, report in reports.items()
        if not report["ok"]
    }
    shown = next(iter(failing), next(iter(reports)))
    return {
        **total,
        "ok": not failing,
        "violations": [name for name in MUST_BE_ZERO if total[name]],
        "calls_by_status": {name: statuses[name] for name in sorted(statuses)},
        "subscriptions": len(reports),
        "failing_subscriptions": _examples(failing),
        "examples": {"subscription": shown, **reports[shown]["examples"]},
    }
