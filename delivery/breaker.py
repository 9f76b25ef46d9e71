"""A subscription's circuit breaker on one worker (docs/policies.md §2).

Closed, calls go out and their results fill a sliding window of per-second buckets. When the
window holds at least ``min_calls`` calls and the failed share reaches ``failure_ratio``, the
breaker opens: no call starts, and calls that come back failed while it is open (the one that
tripped it and those in flight) are *given back*: their attempt is not counted, the message
waits where it is and goes out again with the same attempt number. After ``open_s`` it is
half-open: one call goes through as a probe. Success closes it; failure opens it again, and
the probe's attempt is given back too: however long the outage, waiting messages spend no
attempts and none is dead-lettered because of it (only failures counted before the breaker
opened were spent, as for any flaky endpoint).

A failure is what says the endpoint is not there: a connection error, a timeout or a
retryable status. A non-retryable answer (say 400) is the endpoint answering, a success for
the breaker. A call refused before sending (SSRF rule) says nothing about the endpoint.

:class:`BreakerRules` is the pure state machine (times in ms, passed in);
:class:`CircuitBreaker` adds the waiting on the event loop that the dispatcher needs.

Workers share one fact (the runner publishes it, state/delivery_budget.py): a worker whose
own calls opened its breaker says so in Redis while it stays open; the subscription's other
workers *adopt* it within a second (their breakers open, counting the outage from when it
began), and *release* it when the word goes (that worker's probe closed its breaker, or it
died). A worker started during an outage opens at once instead of spending its own
``min_calls`` failed attempts first.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from setu.clock import now_ms
from setu.outcome import Outcome, Verdict
from setu.policies import BreakerPolicy

log = logging.getLogger(__name__)


# How long a failure that may start an outage waits before it counts (see Settlement).
HOLD_S = 1.0


class Settlement(StrEnum):
    """What becomes of a failed call's attempt.

    ``HELD``: the breaker was closed. The failure may be the first of an outage, so it waits
    :data:`HOLD_S` before it counts: if the breaker opens meanwhile (the other calls of the
    outage come back failed), it is given back like the calls in flight. So an outage in which
    ``min_calls`` calls fail within about a second spends no attempts, where the failures
    before the opening were spent otherwise. The price: a failed message's group waits one
    second more before its retry.
    """

    COUNTED = "counted"
    GIVEN_BACK = "given_back"
    HELD = "held"


class BreakerState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


def is_failure(outcome: Outcome) -> bool | None:
    """Whether a call's outcome says the endpoint is down; None when it says nothing."""
    if outcome.refused:
        return None
    return outcome.verdict is Verdict.RETRY


def describe(outcome: Outcome) -> str:
    """A failed call in a few words, for the breaker's ``last_error``."""
    if outcome.status is not None:
        return f"HTTP {outcome.status}"
    return outcome.error or "failed"


@dataclass(frozen=True, slots=True)
class BreakerView:
    """What status, metrics and the worker's report show."""

    state: BreakerState
    since_ms: int
    last_error: str | None
    # When the endpoint's outage began: the first opening since it was last closed.
    outage_since_ms: int | None
    opened: int  # times opened since this worker started the subscription
    given_back: int  # failed calls whose attempt was not counted
    probes: int  # half-open probe calls made


class BreakerRules:
    """The breaker's decisions, pure: every method takes the time."""

    def __init__(self, policy: BreakerPolicy | None, now: int) -> None:
        self.policy = policy
        self.state = BreakerState.CLOSED
        self.since_ms = now
        self.last_error: str | None = None
        self.outage_since_ms: int | None = None
        self.probing = False
        self.opened = 0
        self.given_back = 0
        self.probes = 0
        # Open because another worker found the endpoint down (adopt), not on this worker's
        # own calls; such a breaker closes again when that worker's word goes (release).
        self.adopted = False
        # When this worker's breaker last closed (None: never): another worker's word of an
        # outage that began before is older than what this one learned since.
        self.closed_at_ms: int | None = None
        # (second, calls, failures), oldest first, within the window.
        self._buckets: deque[list[int]] = deque()
        self.consecutive = 0  # failures since the last success

    def update(self, policy: BreakerPolicy | None, now: int) -> None:
        """New thresholds; no breaker at all closes it."""
        self.policy = policy
        if policy is None and self.state is not BreakerState.CLOSED:
            self._close(now)

    def may_call(self, now: int) -> bool | None:
        """Whether a call may start now: False (wait), True (as a probe), None (closed)."""
        if self.state is BreakerState.CLOSED:
            return None
        if self.state is BreakerState.OPEN:
            if now < self.reopens_at():
                return False
            self._move(BreakerState.HALF_OPEN, now)
        if self.probing:
            return False
        self.probing = True
        self.probes += 1
        return True

    def reopens_at(self) -> int:
        """When an open breaker lets a probe through."""
        assert self.policy is not None
        return self.since_ms + self.policy.open_s * 1000

    def record(self, outcome: Outcome, probe: bool, now: int) -> bool:
        """A call's result; True when its attempt is given back (not counted)."""
        failed = is_failure(outcome)
        # A probe's answer that comes after its breaker closed (released on another worker's
        # word) is an ordinary call's: it must not open the breaker on its own.
        probe = probe and self.state is BreakerState.HALF_OPEN
        if probe:
            self.probing = False
        if failed is None or self.policy is None:
            return False
        if failed:
            self.last_error = describe(outcome)
        if probe:
            if not failed:
                self._close(now)
                return False
            self._open(now)
            self.given_back += 1
            return True
        if self.state is not BreakerState.CLOSED:
            # A call that was in flight when the breaker opened.
            if failed:
                self.given_back += 1
            return failed
        self._count(failed, now)
        if failed and self._tripped():
            self._open(now)
            self.given_back += 1
            return True
        return False

    def suspicious(self) -> bool:
        """Closed (with a policy): a failure now may be the start of an outage."""
        return self.policy is not None and self.state is BreakerState.CLOSED

    def give_back(self) -> None:
        """A held failure (see :class:`CircuitBreaker`) whose breaker opened meanwhile."""
        self.given_back += 1

    def count_success(self, now: int) -> None:
        """A closed breaker's successful call (what :meth:`record` does for one, quicker)."""
        self.consecutive = 0
        second = now // 1000
        last = self._buckets[-1] if self._buckets else None
        if last is not None and last[0] == second:
            last[1] += 1
        else:
            self._count(False, now)

    def cancel_probe(self) -> None:
        """A probe that was not made after all (its partition was given up)."""
        self.probing = False
        self.probes -= 1

    def adopt(self, now: int, outage_since_ms: int | None, last_error: str | None) -> None:
        """Another worker's breaker is open: open this one too (a closed one only), the
        outage counted from when it began there."""
        if self.state is not BreakerState.CLOSED or self.policy is None:
            return
        self.adopted = True
        self.last_error = last_error
        self.outage_since_ms = outage_since_ms if outage_since_ms is not None else now
        self._move(BreakerState.OPEN, now)

    def release(self, now: int) -> None:
        """The worker whose word opened this breaker is gone or closed its own: close."""
        if self.state is not BreakerState.CLOSED:
            self._close(now)

    def view(self) -> BreakerView:
        return BreakerView(
            self.state,
            self.since_ms,
            self.last_error,
            self.outage_since_ms,
            self.opened,
            self.given_back,
            self.probes,
        )

    def _count(self, failed: bool, now: int) -> None:
        assert self.policy is not None
        self.consecutive = self.consecutive + 1 if failed else 0
        second = now // 1000
        buckets = self._buckets
        while buckets and buckets[0][0] <= second - self.policy.window_s:
            buckets.popleft()
        if not buckets or buckets[-1][0] != second:
            buckets.append([second, 0, 0])
        buckets[-1][1] += 1
        buckets[-1][2] += int(failed)

    def _tripped(self) -> bool:
        """The window's share of failures over enough calls, or ``min_calls`` failures in a
        row (an endpoint that went down after a healthy spell: its earlier successes would
        hold the window's share down for up to ``window_s``)."""
        assert self.policy is not None
        if self.consecutive >= self.policy.min_calls:
            return True
        calls = sum(b[1] for b in self._buckets)
        failures = sum(b[2] for b in self._buckets)
        return calls >= self.policy.min_calls and failures >= self.policy.failure_ratio * calls

    def _open(self, now: int) -> None:
        self.adopted = False  # this worker's own calls say so now
        if self.outage_since_ms is None:
            self.outage_since_ms = now
        self.opened += 1
        self._move(BreakerState.OPEN, now)

    def _close(self, now: int) -> None:
        self.closed_at_ms = now
        self.adopted = False
        self.consecutive = 0
        self.outage_since_ms = None
        self.probing = False
        self._buckets.clear()
        self._move(BreakerState.CLOSED, now)

    def _move(self, state: BreakerState, now: int) -> None:
        self.state = state
        self.since_ms = now


class CircuitBreaker:
    """:class:`BreakerRules` for the dispatcher's coroutines: :meth:`admit` waits while open."""

    def __init__(
        self,
        policy: BreakerPolicy | None,
        name: str,
        *,
        clock: Callable[[], int] = now_ms,
        on_change: Callable[[BreakerView], None] = lambda view: None,
    ) -> None:
        self.rules = BreakerRules(policy, clock())
        self._name = name
        self._clock = clock
        self._on_change = on_change
        self._wake = asyncio.Event()

    @property
    def closed(self) -> bool:
        return self.rules.state is BreakerState.CLOSED

    def update(self, policy: BreakerPolicy | None) -> None:
        before = self.rules.state
        self.rules.update(policy, self._clock())
        self._changed(before)

    async def admit(self) -> bool:
        """Waits until a call may start; True when it is the half-open probe."""
        rules = self.rules
        if rules.state is BreakerState.CLOSED:
            return False  # the hot path: no clock, no call
        while True:
            before = rules.state
            allowed = rules.may_call(self._clock())
            if allowed is None:
                return False
            if allowed:
                self._changed(before)
                return True
            wake = self._wake
            timeout = None
            if rules.state is BreakerState.OPEN:
                timeout = max(0.0, (rules.reopens_at() - self._clock()) / 1000)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), timeout)

    def record(self, outcome: Outcome, probe: bool) -> Settlement:
        """A call's result: ``COUNTED`` (to the engine), ``GIVEN_BACK`` (the caller sends the
        same attempt again) or ``HELD`` (the caller asks :meth:`settle` after
        :data:`HOLD_S`)."""
        rules = self.rules
        before = rules.state
        if before is BreakerState.CLOSED and outcome.verdict is not Verdict.RETRY:
            if rules.policy is not None and not outcome.refused:
                rules.count_success(self._clock())  # the hot path
            return Settlement.COUNTED
        probe = probe and before is BreakerState.HALF_OPEN  # see BreakerRules.record
        given_back = rules.record(outcome, probe, self._clock())
        if rules.state is not before:
            self._changed(before)
        if given_back:
            return Settlement.GIVEN_BACK
        if not probe and is_failure(outcome) and rules.suspicious():
            return Settlement.HELD  # only a failure: a success held and given back would be
            # sent again (a duplicate 2xx), which the three-worker test showed
        return Settlement.COUNTED

    def settle(self) -> Settlement:
        """A held failure, :data:`HOLD_S` later: given back if the breaker opened meanwhile,
        else counted."""
        if self.closed:
            return Settlement.COUNTED
        self.rules.give_back()
        return Settlement.GIVEN_BACK

    def cancel_probe(self) -> None:
        self.rules.cancel_probe()
        self._wake_all()

    def adopt(self, shared: dict[str, Any]) -> None:
        """Opens on another worker's word (see :meth:`BreakerRules.adopt`); no event."""
        if not self.closed:
            return
        self.rules.adopt(self._clock(), shared.get("outage_since_ms"), shared.get("last_error"))
        if not self.closed:
            log.warning(
                "%s: circuit breaker open: another worker found the endpoint down (%s)",
                self._name,
                self.rules.last_error,
            )

    def release(self) -> None:
        """Closes a breaker opened on another worker's word that no longer stands."""
        if self.closed:
            return
        self.rules.release(self._clock())
        log.info("%s: circuit breaker closed: the endpoint answers again", self._name)
        self._wake_all()

    def _changed(self, before: BreakerState) -> None:
        view = self.rules.view()
        if view.state is before:
            return
        if before is BreakerState.HALF_OPEN and view.state is BreakerState.OPEN:
            # A failed probe: the same outage goes on (no new opening to tell of).
            log.debug("%s: probe failed (%s); open again", self._name, view.last_error)
            self._wake_all()
            return
        if view.state is BreakerState.OPEN:
            log.warning(
                "%s: circuit breaker open (%s); calls wait, no attempt is spent",
                self._name,
                view.last_error,
            )
        elif view.state is BreakerState.HALF_OPEN:
            log.info("%s: circuit breaker half-open: one probe call", self._name)
        else:
            log.info("%s: circuit breaker closed; calls go out again", self._name)
        self._wake_all()
        self._on_change(view)

    def _wake_all(self) -> None:
        self._wake.set()
        self._wake = asyncio.Event()
