"""Which ingest topics have lost their main topic (pure part of the main topic guard)."""

from __future__ import annotations

from spark.job import project_pattern
from spark.topics import orphaned

PATTERN = project_pattern("p")


def test_an_ingest_topic_without_its_main_topic_is_orphaned_since_first_seen() -> None:
    # Given p.a with both topics, p.b without its main topic, another project's orphan
    topics = {"setu.p.a.ingest", "setu.p.a", "setu.p.b.ingest", "setu.q.c.ingest", "other"}
    # When looked at twice
    first = orphaned(topics, PATTERN, {}, now=10.0)
    second = orphaned(topics, PATTERN, first, now=15.0)
    # Then only p.b counts, missing since the first look
    assert first == second == {"setu.p.b.ingest": 10.0}


def test_a_main_topic_back_in_place_ends_the_count() -> None:
    topics = {"setu.p.b.ingest", "setu.p.b"}
    assert orphaned(topics, PATTERN, {"setu.p.b.ingest": 10.0}, now=15.0) == {}


def test_a_main_topic_without_its_ingest_topic_is_none_of_the_guards_business() -> None:
    assert orphaned({"setu.p.b"}, PATTERN, {}, now=1.0) == {}
