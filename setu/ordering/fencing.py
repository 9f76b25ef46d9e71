"""Fencing a worker that lost a partition index without noticing (a long GC or network pause:
its session timed out, the partition went to another worker, then it woke up and carried on).

Two things keep such a *stale* worker from changing what the new owner owns:

- **Redis.** Taking a partition over bumps its owner epoch (:meth:`GroupStore.claim`); every
  group-state write and recorded outcome names the epoch it was decided under, and the write
  script refuses the whole call when the epoch has moved on (:class:`state.groups.Fenced`).
  The runner then gives up and starts again, as after any failure it cannot repair.
- **Kafka.** A copy the stale worker writes to a retry tier or the DLQ cannot be refused by the
  broker, so it is recognised instead: every copy carries its writer's epoch
  (``setu-epoch``), and every takeover records, *after* bumping the epoch, where each tier
  ended (its *fence*). A copy is a stale worker's when a later epoch's fence lies at or before
  it: it was written after someone else took over, so its Redis write was refused, and the
  source it stands for is handled by the owner. Such copies are skipped. A copy that landed
  before the fence was read by the takeover itself and is completed like a crash's
  (:mod:`delivery.recovery`), which is equally correct.

Fences grow monotonically with epochs (a later takeover reads later ends), so the first
later epoch that has a fence is the one to compare with. Per partition the latest
:data:`KEEP_FENCES` fences are kept: a stale worker notices its loss at its next poll, so only
the fence right after its epoch ever matters.
"""

from __future__ import annotations

from collections.abc import Mapping

KEEP_FENCES = 64


def add_fence(
    fences: dict[int, dict[int, int]], epoch: int, ends: Mapping[int, int], keep: int = KEEP_FENCES
) -> None:
    """Adds ``epoch``'s fence to ``fences`` and forgets all but the latest ``keep``."""
    fences[epoch] = dict(ends)
    for old in sorted(fences)[: max(0, len(fences) - keep)]:
        del fences[old]


def is_stale_copy(
    fences: Mapping[int, Mapping[int, int]], tier: int, offset: int, epoch: int | None
) -> bool:
    """Whether a copy in ``tier`` at ``offset`` written under ``epoch`` came from a worker
    that had already lost the partition. Copies without an epoch (older versions) pass."""
    if epoch is None:
        return False
    later = [e for e in fences if e > epoch and tier in fences[e]]
    if not later:
        return False
    return offset >= fences[min(later)][tier]
