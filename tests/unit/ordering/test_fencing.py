"""Which copies a worker that had lost its partition wrote (setu.ordering.fencing)."""

from __future__ import annotations

import pytest

from setu.ordering.fencing import is_stale_copy
from setu.ordering.tiers import DLQ

# Epoch 3 took over when rq.1 ended at 10 and the DLQ at 4; epoch 5 at 20 and 9.
FENCES = {3: {1: 10, DLQ: 4}, 5: {1: 20, DLQ: 9}}


@pytest.mark.parametrize(
    ("tier", "offset", "epoch", "stale"),
    [
        (1, 9, 2, False),  # before epoch 3's fence: read by that takeover, completed there
        (1, 10, 2, True),  # written after epoch 3 took over
        (1, 15, 3, False),  # epoch 3's own, before epoch 5's fence
        (1, 25, 3, True),
        (1, 25, 4, True),  # epoch 4 left no fence: epoch 5's is the next one
        (1, 25, 5, False),  # the latest epoch
        (DLQ, 5, 2, True),
        (DLQ, 5, 4, False),
        (2, 99, 1, False),  # a tier no fence knows of
        (1, 99, None, False),  # a copy of an older version, without an epoch
    ],
)
def test_stale_copies(tier: int, offset: int, epoch: int | None, stale: bool) -> None:
    assert is_stale_copy(FENCES, tier, offset, epoch) is stale
