"""Which ingest topics have lost their main topic (pure part of the main topic guard)."""

from __future__ import annotations

from collections.abc import Collection

from setu.names import SHARED_INGEST_LOG
from spark.job import project_pattern
from spark.topics import looked_after, orphaned

PATTERN = project_pattern("p")


def orphans(
    topics: set[str], since: dict[str, float], now: float, pattern: str = PATTERN
) -> dict[str, float]:
    return orphaned(topics, looked_after(topics, pattern), since, now)


def test_an_ingest_topic_without_its_main_topic_is_orphaned_since_first_seen() -> None:
    # Given p.a with both topics, p.b without its main topic, another project's orphan
    topics = {"setu.p.a.ingest", "setu.p.a", "setu.p.b.ingest", "setu.q.c.ingest", "other"}
    # When looked at twice
    first = orphans(topics, {}, now=10.0)
    second = orphans(topics, first, now=15.0)
    # Then only p.b counts, missing since the first look
    assert first == second == {"setu.p.b.ingest": 10.0}


def test_a_main_topic_back_in_place_ends_the_count() -> None:
    topics = {"setu.p.b.ingest", "setu.p.b"}
    assert orphans(topics, {"setu.p.b.ingest": 10.0}, now=15.0) == {}


def test_a_main_topic_without_its_ingest_topic_is_none_of_the_guards_business() -> None:
    assert orphans({"setu.p.b"}, {}, now=1.0) == {}


def test_with_the_shared_log_the_topics_read_from_it_are_looked_after_like_their_rejects() -> None:
    # Given the shared log, p.a read from it with its reject topic, p.b read but with no
    # topic left at all, and p.c with a topic of its own from before a switch
    pattern = rf"^(?:setu\.p\.[a-z0-9-]+\.ingest|{SHARED_INGEST_LOG.replace('.', '[.]')})$"
    topics = {SHARED_INGEST_LOG, "setu.p.a.ingest.rejects", "setu.p.c.ingest", "setu.p.c"}
    seen: Collection[str] = {"setu.p.a.ingest", "setu.p.b.ingest"}
    # Then the shared log is not taken for a topic's, p.a is shaped like its reject topic
    assert looked_after(topics, pattern, seen) == {
        "setu.p.a.ingest": "setu.p.a.ingest.rejects",
        "setu.p.c.ingest": "setu.p.c.ingest",
    }
    # And p.a has lost its main topic
    assert orphaned(topics, looked_after(topics, pattern, seen), {}, now=1.0) == {
        "setu.p.a.ingest": 1.0
    }
