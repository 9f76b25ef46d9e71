"""A subscription's policies on this worker (docs/policies.md §2, §3, §5): the circuit
breaker, shared with the subscription's other workers; the auto-pause; and this worker's share
of ``max_in_flight``.

:class:`SubscriptionGuards` owns them and their periodic work (:meth:`periodic`); the runner
only schedules it and hands over what happened (calls, dead letters, updates). A new policy
lives here, not in the runner.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from delivery.autopause import AutoPause
from delivery.breaker import BreakerRules, BreakerState, BreakerView, CircuitBreaker
from delivery.dispatcher import Dispatcher
from delivery.events import Emit
from delivery.metrics import SubscriptionMetrics
from delivery.ticker import Periodic, Work, at_once
from delivery.watch import Watched
from setu.clock import now_ms
from setu.model import Subscription, SubscriptionState
from state.delivery_budget import SLOT_ENTRY_TTL_MS, SLOT_IDLE_TTL_MS, DeliveryBudget

log = logging.getLogger(__name__)

# How often a runner asks whether a policy pauses its subscription.
POLICY_CHECK_MS = 1000
# How often a resting runner looks anyway (another worker's word on the breaker, a pause).
POLICY_REST_MS = 5000
# How often a runner renews its share of max_in_flight, and the headroom it asks for beyond
# what it wants now (state/delivery_budget.py).
SLOT_RENEW_MS = 250
SLOT_HEADROOM = 4
# A renewal that would change nothing (the same ask, granted in full, as many calls going) is
# skipped until this long after the last: the share's entry lives SLOT_ENTRY_TTL_MS (3 s), and
# a steady subscription need not write it four times a second. An idle one (nothing wanted,
# nothing going) writes an entry that lives SLOT_IDLE_TTL_MS (10 s), every SLOT_IDLE_RENEW_MS.
SLOT_QUIET_RENEW_MS = 1000
SLOT_IDLE_RENEW_MS = 5000
# Idle this long, a runner gives its share back (asks for none) and stops renewing it until
# calls are wanted again; its first record then waits for one renewal, a Redis round trip.
# A thousand idle subscriptions renewing their headroom every 5 s were 200 scripts a second
# and about a sixth of an idle worker's CPU (docs/delivery.md, "What an idle subscription
# costs").
SLOT_DORMANT_MS = 30_000
# How long a worker's word that its breaker is open lasts unless renewed (every policy check).
SHARED_BREAKER_TTL_MS = 5_000


def breaker_report(view: BreakerView) -> dict[str, Any]:
    """The breaker as a worker reports it (the API's status sums the workers' reports)."""
    return {
        "state": view.state.value,
        "since_ms": view.since_ms,
        "last_error": view.last_error,
        "outage_since_ms": view.outage_since_ms,
    }


class SubscriptionGuards:
    def __init__(
        self,
        sub: Subscription,
        worker_id: str,
        metrics: SubscriptionMetrics,
        emit: Emit,
        background: Callable[[Coroutine[Any, Any, None]], None],
        budget: DeliveryBudget | None = None,
        pause: Callable[[str], Awaitable[None]] | None = None,
    ) -> None:
        """``background`` runs housekeeping nothing waits for; ``budget``: max_in_flight
        shared with the subscription's other workers (None: this worker alone keeps it);
        ``pause`` stores a policy's pause with its reason (None: policies never pause)."""
        self.sub = sub
        self._worker_id = worker_id
        self._metrics = metrics
        self._emit = emit
        self._background = background
        self.budget = budget
        self._pause = pause
        self._pausing = False  # a policy pause is on its way to the store
        # The worker's reading of Redis, which carries the shared breaker (delivery/watch.py);
        # None, or stale: the check reads it itself.
        self.watched: Watched | None = None
        # The last renewal of the share: (ask, busy, granted, when in ms).
        self._last_share: tuple[int, int, int, int] | None = None
        # Since when nothing was wanted and nothing going (ms; None: something is).
        self._idle_since: int | None = None
        self.breaker = CircuitBreaker(
            sub.policies.circuit_breaker,
            f"subscription {sub.project}/{sub.name}",
            on_change=self._breaker_changed,
        )
        self.autopause = AutoPause(sub.policies)

    def periodic(
        self, dispatcher: Dispatcher, busy: Callable[[], int], paused: Callable[[], bool]
    ) -> list[Periodic]:
        """The guards' periodic work, given the runner's dispatcher, how many calls are being
        made, and whether the subscription is paused."""
        # Resting (nothing in memory, no call going), the breaker has nothing to open or close
        # on and no policy anything to pause for: records arriving wake the check at once.
        work = [
            Periodic(
                POLICY_CHECK_MS,
                lambda: self.check_tick(paused()),
                rests=True,
                rest_ms=POLICY_REST_MS,
            )
        ]
        if self.budget is not None:
            # Idle, the share is renewed every SLOT_IDLE_RENEW_MS anyway: a tick a second does.
            renew = Periodic(
                SLOT_RENEW_MS,
                lambda: self.renew_tick(dispatcher, busy()),
                rests=True,
                # An idle share is renewed every SLOT_IDLE_RENEW_MS: a look at half that.
                rest_ms=SLOT_IDLE_RENEW_MS // 2,
                # Unrenewed, this worker's share lapses and another may be granted it while
                # this one still calls with it.
                patient=False,
            )
            work.append(renew)
        return work

    def update(self, sub: Subscription) -> None:
        if sub.state is not SubscriptionState.PAUSED:
            self._pausing = False
            if self.sub.state is SubscriptionState.PAUSED:
                self.autopause.reset()  # resumed: the window starts again
        self.breaker.update(sub.policies.circuit_breaker)
        self.autopause.update(sub.policies)
        self.sub = sub

    async def leave(self) -> None:
        """This worker no longer takes a share of ``max_in_flight``."""
        if self.budget is not None:
            await self.budget.leave(self._worker_id)

    async def renew_slots(self, dispatcher: Dispatcher, busy: int) -> None:
        """Asks for this worker's share of ``max_in_flight`` (state/delivery_budget.py): what
        it wants going, with headroom so a burst need not wait a round, and what it has."""
        await at_once(lambda: self.renew_tick(dispatcher, busy))

    def renew_tick(self, dispatcher: Dispatcher, busy: int) -> Coroutine[Any, Any, None] | None:
        """:meth:`renew_slots` as periodic work: None when a renewal would change nothing."""
        assert self.budget is not None
        limit = self.sub.max_in_flight
        demand = dispatcher.demand()
        ask = min(limit, demand + max(SLOT_HEADROOM, demand))
        now = now_ms()
        last = self._last_share
        idle = demand == 0 and busy == 0
        if not idle:
            self._idle_since = None
        elif self._idle_since is None:
            self._idle_since = now
        elif now - self._idle_since >= SLOT_DORMANT_MS:
            if last is not None and last[:3] == (0, 0, 0) and dispatcher.size == 0:
                return None  # holds nothing, wants nothing: nothing to renew
            ask = 0
        quiet_ms = SLOT_IDLE_RENEW_MS if idle else SLOT_QUIET_RENEW_MS
        if (
            last is not None
            and last[:3] == (ask, busy, ask)
            and dispatcher.size == ask
            and now - last[3] < quiet_ms
        ):
            return None
        return self._renew(dispatcher, ask, busy, limit, idle, now)

    async def _renew(
        self, dispatcher: Dispatcher, ask: int, busy: int, limit: int, idle: bool, now: int
    ) -> None:
        assert self.budget is not None
        ttl_ms = SLOT_IDLE_TTL_MS if idle else SLOT_ENTRY_TTL_MS
        # Until the answer arrives the pool keeps its size and may start that many calls
        # (records arriving meanwhile): they are held too, or another worker could be granted
        # them as well. A smaller grant is said at the next renewal, once applied.
        holding = max(busy, dispatcher.size)
        granted = await self.budget.share(self._worker_id, ask, holding, limit, ttl_ms)
        self._last_share = (ask, busy, granted, now)
        if granted != dispatcher.size:
            dispatcher.resize(granted)

    async def check(self, paused: bool) -> None:
        """Shares the breaker, then pauses the subscription when a policy says so."""
        await at_once(lambda: self.check_tick(paused))

    def check_tick(self, paused: bool) -> Coroutine[Any, Any, None] | None:
        """:meth:`check` as periodic work: None when the worker's reading of Redis is fresh
        (delivery/watch.py) and there is nothing to publish or pause."""
        said = None
        if self.budget is not None:
            watched = self.watched
            if watched is None or not watched.fresh():
                return self._check_asking(paused)
            said = self._sync_breaker(watched.breaker)
        return self._decided(said, paused)

    async def _check_asking(self, paused: bool) -> None:
        """:meth:`check` with the shared breaker read from Redis (no fresh reading)."""
        assert self.budget is not None
        said = self._sync_breaker(await self.budget.shared_breaker())
        await at_once(lambda: self._decided(said, paused))

    def _decided(
        self, said: dict[str, Any] | None, paused: bool
    ) -> Coroutine[Any, Any, None] | None:
        """What is left to do once the breaker is shared: publish it (``said``) and store a
        policy's pause, if either is due."""
        reason = None
        if self._pause is not None and not self._pausing and not paused:
            reason = self.autopause.reason(self.breaker.rules.view(), now_ms())
        if said is None and reason is None:
            return None
        return self._act(said, reason)

    async def _act(self, said: dict[str, Any] | None, reason: str | None) -> None:
        """Publishes this worker's open breaker (``said``) and stores a policy's pause."""
        if said is not None:
            assert self.budget is not None
            await self.budget.publish_breaker(said, SHARED_BREAKER_TTL_MS)
        if reason is None or self._pause is None or self._pausing:
            return
        self._pausing = True
        sub = self.sub
        log.warning("subscription %s/%s: pausing: %s", sub.project, sub.name, reason)
        try:
            await self._pause(reason)
            self._emit("subscription.paused", {"reason": reason})
        except Exception as exc:  # tried again at the next check
            log.warning("subscription %s/%s: pause not stored: %s", sub.project, sub.name, exc)
            self._pausing = False

    def _breaker_changed(self, view: BreakerView) -> None:
        self._metrics.breaker_changed(view)
        if view.state is not BreakerState.HALF_OPEN:
            kind = "opened" if view.state is BreakerState.OPEN else "closed"
            self._emit(f"endpoint.breaker_{kind}", breaker_report(view))
        if view.state is BreakerState.CLOSED and self.budget is not None:
            # A probe got through: the other workers may call again (_sync_breaker).
            self._background(self.budget.close_breaker(view.since_ms, SHARED_BREAKER_TTL_MS))

    def _sync_breaker(self, shared: dict[str, Any] | None) -> dict[str, Any] | None:
        """Shares the breaker with the subscription's other workers (delivery/breaker.py),
        given what they said (``shared``): adopts another worker's open breaker, closes when
        another worker's probe got through, carries an adopted outage on when its owner is
        gone; returns this worker's own open breaker to publish while it stays open."""
        breaker, rules = self.breaker, self.breaker.rules
        word = None if shared is None else shared.get("state")
        if rules.state is BreakerState.CLOSED:
            if shared is not None and word == BreakerState.OPEN.value and not _older(shared, rules):
                breaker.adopt(shared)
            return None
        if word == BreakerState.CLOSED.value:
            breaker.release()  # another worker's probe got through
            return None
        if rules.adopted and shared is None:
            rules.adopted = False  # its owner is gone: this worker carries the outage on
        if rules.adopted:
            return None
        return {**breaker_report(rules.view()), "state": BreakerState.OPEN.value}


def _older(shared: dict[str, Any], rules: BreakerRules) -> bool:
    """Whether another worker's open breaker opened before this one last closed: a word
    this worker's probe has answered since (its own, published while it was open, read back
    from a reading up to a few seconds old, re-opened a breaker that had just closed)."""
    opened, closed = shared.get("since_ms"), rules.closed_at_ms
    return closed is not None and isinstance(opened, int) and opened < closed


async def first(work: Work, what: str, sub: Subscription) -> None:
    """Runs ``work`` once now, logging a failure instead of raising it: periodic work done at
    once at the start, which its next round does again anyway."""
    try:
        await at_once(work)
    except Exception as exc:
        log.warning("subscription %s/%s: first %s failed: %s", sub.project, sub.name, what, exc)
