"""When a subscription pauses itself (docs/policies.md §3), decided purely.

Two rules, each off when its policy is None:

- ``auto_pause_after_s``: the endpoint's outage (the circuit breaker opened and has not
  closed since) has lasted this long.
- ``dead_letter_window``: of the last ``size`` messages this worker finished, more than
  ``threshold`` were dead-lettered. A message counts as finished when it is delivered or when
  it is itself dead-lettered (a group's failed head, a message dead-lettered under ``skip``,
  an ungrouped message, a released letter failing again); messages parked behind a failed head
  are not failures of their own and do not count.

Each worker judges what it sees; the first to find a rule broken pauses the subscription in
the metadata store, and every worker follows the stored state.
"""

from __future__ import annotations

from collections import deque

from delivery.breaker import BreakerView
from setu.policies import Policies


class AutoPause:
    def __init__(self, policies: Policies) -> None:
        self._policies = policies
        self._window: deque[bool] = deque(maxlen=self._size())
        self._dead = 0

    def _size(self) -> int:
        window = self._policies.dead_letter_window
        return window.size if window is not None else 1

    def update(self, policies: Policies) -> None:
        old = self._policies.dead_letter_window
        self._policies = policies
        if policies.dead_letter_window != old:
            self.reset()

    def reset(self) -> None:
        """Forgets the window (a new window policy, or the subscription was resumed)."""
        self._window = deque(maxlen=self._size())
        self._dead = 0

    def finished(self, dead_lettered: bool) -> None:
        if self._policies.dead_letter_window is None:
            return
        window = self._window
        if len(window) == window.maxlen and window[0]:
            self._dead -= 1
        window.append(dead_lettered)
        self._dead += int(dead_lettered)

    def reason(self, breaker: BreakerView, now_ms: int) -> str | None:
        """Why the subscription should pause now, or None."""
        after = self._policies.auto_pause_after_s
        since = breaker.outage_since_ms
        if after is not None and since is not None and now_ms - since >= after * 1000:
            return (
                f"endpoint broken for {(now_ms - since) // 1000} s (auto_pause_after_s "
                f"{after}); last error: {breaker.last_error}"
            )
        window = self._policies.dead_letter_window
        if window is not None and self._dead > window.threshold:
            return (
                f"dead_letter_window: {self._dead} of the last {len(self._window)} messages "
                f"dead-lettered (more than {window.threshold} of {window.size})"
            )
        return None
