"""Reading a producer's mark: the hash field ``keys.producer_marks(project, topic)[producer]``
that the ingest job raises (``spark/marks.py`` writes it)."""

from __future__ import annotations

NO_SEQUENCE = -1


def parse_mark(raw: bytes | str) -> tuple[int, int]:
    """A stored mark as (topic incarnation, sequence). ``"<incarnation>:<sequence>"``; a bare
    sequence was written before incarnations existed (incarnation 0)."""
    text = raw.decode() if isinstance(raw, bytes) else raw
    incarnation, _, sequence = text.rpartition(":")
    return int(incarnation or 0), int(sequence)


def last_sequence(raw: bytes | str | None, topic_incarnation: int) -> int:
    """The highest sequence accepted from the producer in the topic's current incarnation
    (-1 if none): a mark a deleted topic of the same name left behind does not count."""
    if raw is None:
        return NO_SEQUENCE
    incarnation, sequence = parse_mark(raw)
    if incarnation not in (0, topic_incarnation):
        return NO_SEQUENCE
    return sequence
