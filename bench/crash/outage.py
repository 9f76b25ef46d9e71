"""What the run's endpoint outage did (docs/policies.md §2), from the receiver's journals: pure.

During the outage every call fails. A failed call *spent* an attempt when the same message's
next call carries a higher ``X_DELIVERY_ATTEMPT`` (or never comes: it was dead-lettered and
delivered after an unsideline under a new count); a call given back by an open breaker is
followed by one with the same number. Calls made by a worker that died before it recorded the
failure are followed by the same number too (docs/delivery.md), so under kills the figure is a
floor, not exact; the breaker's own count is ``setu_delivery_breaker_given_back_total``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from bench.crash.journal import Entry

# How long after the outage the breaker may take to close: open_s plus a probe's round trip,
# with room for a worker killed and started again meanwhile.
CLOSE_GRACE_MS = 60_000
# A breaker that opens this soon after the outage's end opened on the outage's last failures:
# the receiver journals the end at the first call it lets through, which can come before the
# last failed calls' answers reach their worker's breaker (12 ms after, in a short crash run
# on a loaded machine, counted as "never opened").
OPEN_GRACE_MS = 1_000


def outage_figures(
    length_ms: int, calls: Sequence[Entry], events: Sequence[Entry], min_calls: int = 1
) -> dict[str, Any]:
    """The figures of an outage of ``length_ms`` that opened when the receiver journalled
    ``outage.started`` among ``events`` (and lasted until ``outage.ended`` when that was
    journalled: a stretched outage, bench/crash/plan.py). The breaker is judged only when the
    outage saw at least ``min_calls`` failed calls (the breakers' own minimum, over all
    workers): chaos that kills the workers all through a short outage leaves them nothing to
    open on."""
    began = [e["at_ms"] for e in events if e["type"] == "outage.started"]
    if not began:
        return {"started": False, "violations": ["outage_never_started"]}
    start = began[0]
    ended = [e["at_ms"] for e in events if e["type"] == "outage.ended"]
    end = ended[0] if ended else start + length_ms
    by_message: dict[str, list[Entry]] = defaultdict(list)
    for call in calls:
        by_message[call["mid"]].append(call)
    during = [c for c in calls if start <= c["t"] < end]
    spent = 0
    for call in during:
        if call["status"] < 500:
            continue
        later = [c for c in by_message[call["mid"]] if c["t"] > call["t"]]
        if not later or _attempt(later[0]) > _attempt(call):
            spent += 1
    opened = sorted(e["at_ms"] for e in events if e["type"] == "endpoint.breaker_opened")
    closed = sorted(e["at_ms"] for e in events if e["type"] == "endpoint.breaker_closed")
    opened_in = [t for t in opened if start <= t < end + OPEN_GRACE_MS]
    closed_after = [t for t in closed if opened_in and t >= opened_in[0]]
    closes = [t for t in closed_after if end <= t < end + CLOSE_GRACE_MS]
    failed = sum(c["status"] >= 500 for c in during)
    judged = failed >= min_calls
    return {
        "started": True,
        "window_ms": [start, end],
        "seconds": round((end - start) / 1000, 1),
        "calls": len(during),
        "failed_calls": failed,
        "breaker_judged": judged,
        "attempts_spent": spent,
        "breaker_opened": len(opened_in),
        "breaker_closed": len(closed_after),
        "first_opened_after_ms": opened_in[0] - start if opened_in else None,
        "closed_after_outage_ms": closes[0] - end if closes else None,
        # A breaker that never opens in a long outage is a defect. One that is not seen
        # closing is reported only: a worker killed while its breaker is open, or started
        # late in the outage, closes nothing (its successor starts closed).
        "violations": ["breaker_never_opened"] if judged and not opened_in else [],
    }


def _attempt(call: Entry) -> int:
    try:
        return int(call.get("attempt") or 0)
    except ValueError:
        return 0
