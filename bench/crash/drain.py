"""The drain phase: make the receiver accept everything, unsideline, wait for quiescence.

Quiescent means: every acknowledged message has a 2xx in the receiver's journal for every
subscription of the run's topic, none of them reports a failed group, and the webhook has had
no call for ``quiet_s`` (so late duplicates land in the journal before the verdict). The drain
never decides loss itself: at its deadline it simply stops, and the checker counts what is
missing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx

from bench.crash.checker import published_from_journal
from bench.crash.journal import JournalTail, read_entries
from bench.crash.plan import Phase
from bench.crash.receiver import subscription_of
from bench.crash.setu_api import SetuApi, SetuApiError
from setu.clock import now_ms

POLL_S = 1.0
# A subscription's groups looked up one by one at most; beyond, it unsidelines by time.
MAX_LOOKUPS = 20
REPORT_EVERY_S = 10.0


async def drain(
    apis: Sequence[SetuApi],
    receiver: httpx.AsyncClient,
    producer_journal: Path,
    receiver_journal: Path,
    *,
    timeout_s: float,
    quiet_s: float,
    say: Callable[[str], None],
    poll_s: float = POLL_S,
) -> dict[str, Any]:
    """Drive the run to quiescence, for every subscription in ``apis`` (one per subscription
    of the run's topic, each with its own endpoint path); returns what it did (JSON-ready)."""
    response = await receiver.post("/control/phase", json={"phase": Phase.DRAIN.value})
    response.raise_for_status()
    published = published_from_journal(read_entries(producer_journal))
    group_of = {p.message_id: p.group_id for p in published}
    acked = {p.message_id for p in published if p.acked}
    tail = JournalTail(receiver_journal)
    delivered: dict[str, set[str]] = {api.subscription: set() for api in apis}
    last_call = time.monotonic()
    unsidelined: set[tuple[str, str]] = set()
    unsideline_calls = 0
    started = time.monotonic()
    next_report = started + REPORT_EVERY_S
    while True:
        now = time.monotonic()
        entries = tail.read_new()
        if entries:
            last_call = now
        for entry in entries:
            if 200 <= int(entry["status"]) < 300:
                delivered.setdefault(subscription_of(entry), set()).add(entry["mid"])
        missing = failed = 0
        for api in apis:
            left = acked - delivered[api.subscription]
            groups_failed = await _failed_groups(api)
            missing += len(left)
            failed += groups_failed or 0
            if groups_failed == 0:
                # Nothing is held: what is missing is on its way (the status is a report of
                # the last few seconds, so a group failing now is seen at a later poll).
                continue
            released = await _release(
                api, {group_of[mid] for mid in left} or set(group_of.values()), len(apis) > 1
            )
            if released is not None:
                unsideline_calls += 1
                unsidelined.update((api.subscription, group) for group in released)
                failed += 1
        quiet = now - last_call >= quiet_s
        if not missing and not failed and quiet:
            quiescent = True
            break
        if now - started > timeout_s:
            quiescent = False
            break
        if now >= next_report:
            say(f"drain: {missing} acknowledged not yet delivered, {failed} failed groups")
            next_report = now + REPORT_EVERY_S
        await asyncio.sleep(poll_s)
    say(
        f"drain: {'quiescent' if quiescent else 'gave up'} after {time.monotonic() - started:.0f} s"
    )
    return {
        "quiescent": quiescent,
        "seconds": round(time.monotonic() - started, 1),
        "unsidelined_groups": len(unsidelined),
        "unsideline_calls": unsideline_calls,
        "undelivered_at_end": sum(len(acked - got) for got in delivered.values()),
    }


async def _release(api: SetuApi, candidates: set[str], many: bool) -> list[str] | None:
    """Unsidelines the dead-lettered groups among ``candidates`` (the groups of the messages
    the subscription misses, or all groups when it misses none: a failed group may hold only
    unacknowledged records). Returns the groups released, [] when released by time (``many``:
    one of many subscriptions, with more candidates than are looked up one by one), None
    when nothing was."""
    if many and len(candidates) > MAX_LOOKUPS:
        # Too many to ask one by one (a run of many subscriptions): every dead letter so far,
        # in one call, as an operator would.
        return [] if await api.unsideline_failed_before(now_ms()) else None
    dead = await _dead_lettered(api, sorted(candidates))
    if not dead:
        return None
    await api.unsideline(dead)
    return dead


async def _failed_groups(api: SetuApi) -> int | None:
    """The subscription's failed-group count; None when the status endpoint does not answer
    (then quiescence rests on the journal alone)."""
    try:
        status = await api.status()
    except SetuApiError:
        return None
    value = status.get("failed_groups")
    return int(value) if isinstance(value, int) else None


async def _dead_lettered(api: SetuApi, groups: list[str]) -> list[str]:
    dead = []
    for group in groups:
        try:
            state = await api.group_state(group)
        except SetuApiError:
            continue
        if state.get("state") == "dead_lettered":
            dead.append(group)
    return dead
