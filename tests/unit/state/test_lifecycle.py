"""Subscription lifecycle transitions."""

from __future__ import annotations

import pytest

from setu.errors import Conflict
from setu.model import SubscriptionState
from state.lifecycle import LifecycleAction, next_state

RUNNING, PAUSED, STOPPED = (
    SubscriptionState.RUNNING,
    SubscriptionState.PAUSED,
    SubscriptionState.STOPPED,
)
A = LifecycleAction


@pytest.mark.parametrize(
    ("current", "action", "after"),
    [
        (RUNNING, A.START, RUNNING),
        (PAUSED, A.START, RUNNING),
        (STOPPED, A.START, RUNNING),
        (RUNNING, A.STOP, STOPPED),
        (PAUSED, A.STOP, STOPPED),
        (STOPPED, A.STOP, STOPPED),
        (RUNNING, A.PAUSE, PAUSED),
        (PAUSED, A.PAUSE, PAUSED),
        (PAUSED, A.RESUME, RUNNING),
        (RUNNING, A.RESUME, RUNNING),
    ],
)
def test_transitions(
    current: SubscriptionState, action: LifecycleAction, after: SubscriptionState
) -> None:
    assert next_state(current, action) is after


@pytest.mark.parametrize("action", [A.PAUSE, A.RESUME])
def test_a_stopped_subscription_only_starts(action: LifecycleAction) -> None:
    with pytest.raises(Conflict, match="use start"):
        next_state(STOPPED, action)
