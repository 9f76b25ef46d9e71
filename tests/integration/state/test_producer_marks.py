"""Producer marks: the same contract on Redis (the Lua raise) and on the stub."""

from __future__ import annotations

import uuid

import pytest

from state.producer_marks import MarkStore, ProducerMarks, StubProducerMarks
from tests.integration.contracts import contract

pytestmark = pytest.mark.integration


marks = contract(
    {
        "stub": lambda backing: StubProducerMarks(),
        "redis": lambda backing: ProducerMarks(backing.client()),
    }
)


def test_a_mark_only_rises_and_a_newer_incarnation_wins(marks: MarkStore) -> None:
    project = f"m{uuid.uuid4().hex[:8]}"
    # A batch, then a replayed older one: the mark stays at the higher sequence
    marks.raise_marks(project, "t", {"p": (1, 5), "q": (1, 2)})
    marks.raise_marks(project, "t", {"p": (1, 3)})
    assert marks.mark(project, "t", "p") == (1, 5)
    # The topic created again (incarnation 2) starts low, and a late batch of the deleted
    # topic cannot overwrite it
    marks.raise_marks(project, "t", {"p": (2, 0)})
    marks.raise_marks(project, "t", {"p": (1, 9)})
    assert marks.mark(project, "t", "p") == (2, 0)
    assert marks.mark(project, "t", "q") == (1, 2)
    assert marks.mark(project, "other", "p") is None


def test_once_every_mark_is_published_the_store_says_so(marks: MarkStore) -> None:
    # The ingest job sets this after publishing every mark it knows (Redis that forgot its
    # data lacks it, and the job publishes them all again)
    marks.set_all_loaded()
    assert marks.all_loaded() is True
