"""Subscription lifecycle: which action moves a subscription from which state to which.

``stop`` releases the subscription's partitions (its consumers leave the group); ``pause``
keeps them but dispatches nothing. ``start`` runs a subscription from any state; ``resume``
only undoes a pause, so it cannot silently restart a subscription an operator stopped.
Repeating an action is harmless: it leaves the state as it is.
"""

from __future__ import annotations

from enum import StrEnum

from setu.errors import Conflict
from setu.model import SubscriptionState


class LifecycleAction(StrEnum):
    START = "start"
    STOP = "stop"
    PAUSE = "pause"
    RESUME = "resume"


_RUNNING = SubscriptionState.RUNNING
_PAUSED = SubscriptionState.PAUSED
_STOPPED = SubscriptionState.STOPPED

_TRANSITIONS: dict[tuple[LifecycleAction, SubscriptionState], SubscriptionState] = {
    (LifecycleAction.START, _RUNNING): _RUNNING,
    (LifecycleAction.START, _PAUSED): _RUNNING,
    (LifecycleAction.START, _STOPPED): _RUNNING,
    (LifecycleAction.STOP, _RUNNING): _STOPPED,
    (LifecycleAction.STOP, _PAUSED): _STOPPED,
    (LifecycleAction.STOP, _STOPPED): _STOPPED,
    (LifecycleAction.PAUSE, _RUNNING): _PAUSED,
    (LifecycleAction.PAUSE, _PAUSED): _PAUSED,
    (LifecycleAction.RESUME, _PAUSED): _RUNNING,
    (LifecycleAction.RESUME, _RUNNING): _RUNNING,
}


def next_state(current: SubscriptionState, action: LifecycleAction) -> SubscriptionState:
    """The state after ``action``; raises Conflict when the action makes no sense from here."""
    try:
        return _TRANSITIONS[(action, current)]
    except KeyError:
        raise Conflict(
            f"cannot {action.value} a {current.value} subscription; use start instead"
        ) from None
