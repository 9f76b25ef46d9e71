"""The main topic guard on the real broker: a main topic deleted by hand comes back."""

from __future__ import annotations

import pytest
from confluent_kafka.admin._config import ConfigResource

from setu import names
from spark import job
from spark.topics import MainTopicGuard
from state.retired_topics import RetiredTopics
from tests.integration.spark.support import IngestWorld, wait_for
from tests.kafka_topics import partitions_of

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def main_topic_config(world: IngestWorld, topic: str) -> tuple[int, dict[str, str]]:
    main = names.main_topic(world.project, topic)
    partitions = len(partitions_of(world.admin, main))
    resource = ConfigResource(ConfigResource.Type.TOPIC, main)
    entries = world.admin.describe_configs([resource])[resource].result(timeout=30)
    return partitions, {name: entry.value for name, entry in entries.items()}


def delete_main_topic(world: IngestWorld, topic: str) -> None:
    main = names.main_topic(world.project, topic)
    world.admin.delete_topics([main])[main].result(timeout=30)
    wait_for("the main topic to go", lambda: main not in world.admin.list_topics(timeout=10).topics)


def test_a_missing_main_topic_is_created_again_like_its_ingest_topic(world: IngestWorld) -> None:
    # Given topic a with 3 partitions and a topic-level retention, and topic b, both whole
    world.create_topic("a", partitions=3, config={"retention.ms": "3600000"})
    world.create_topic("b")
    recreated: list[str] = []
    guard = MainTopicGuard(
        world.bootstrap,
        job.project_pattern(world.project),
        grace_s=0,
        on_recreated=recreated.append,
    )
    assert guard.check() == []
    # When a's main topic is deleted by hand
    delete_main_topic(world, "a")
    # Then the guard creates it again, shaped like a's ingest topic, and leaves b alone
    assert guard.check() == [names.main_topic(world.project, "a")]
    assert recreated == [names.main_topic(world.project, "a")]
    partitions, config = main_topic_config(world, "a")
    assert partitions == 3 and config["retention.ms"] == "3600000"
    assert guard.check() == []


def test_a_main_topic_missing_for_less_than_the_grace_period_is_left_to_the_api(
    world: IngestWorld,
) -> None:
    # Given a topic whose main topic is gone, and a guard with a minute's grace
    world.create_topic("a")
    delete_main_topic(world, "a")
    guard = MainTopicGuard(world.bootstrap, job.project_pattern(world.project), grace_s=60)
    # When it looks, then it does nothing yet (the API may be deleting the topic)
    assert guard.check() == []
    assert names.main_topic(world.project, "a") not in world.admin.list_topics(timeout=10).topics


def test_ingest_goes_on_for_every_topic_after_a_main_topic_is_deleted(world: IngestWorld) -> None:
    # Given the job running over topics a and b, with the guard watching
    world.create_topic("a")
    world.create_topic("b")
    log_b = world.main_log("b")
    pattern = job.project_pattern(world.project)
    guard = MainTopicGuard(world.bootstrap, pattern, interval_s=0.5, grace_s=1).start()
    try:
        with world.running_job(world.settings()):
            world.send("a", "a1", "g")
            world.send("b", "b1", "g")
            world.flush()
            log_b.wait_for_ids({"b1"})
            # When a's main topic is deleted by hand and both topics get new messages
            delete_main_topic(world, "a")
            world.send("a", "a2", "g")
            world.send("b", "b2", "g")
            world.flush()
            # Then b's message still arrives, and a's lands in its main topic created again
            # (a stuck batch held every topic for minutes)
            log_b.wait_for_ids({"b2"}, timeout_s=90)
            main_a = names.main_topic(world.project, "a")
            wait_for("a's main topic", lambda: main_a in world.admin.list_topics(timeout=10).topics)
            world.main_log("a").wait_for_ids({"a2"}, timeout_s=90)
    finally:
        guard.stop()


def test_the_topics_of_a_deleted_topic_are_left_alone(world: IngestWorld) -> None:
    # Given topic a deleted through the API: its ingest topic kept, emptied and retired
    world.create_topic("a")
    world.delete_topic("a")
    guard = MainTopicGuard(
        world.bootstrap,
        job.project_pattern(world.project),
        grace_s=0,
        retired=RetiredTopics(world.redis),
    )
    # When the guard looks, then it makes neither a main topic nor a reject topic for it
    assert guard.check() == []
    listed = world.admin.list_topics(timeout=10).topics
    assert names.main_topic(world.project, "a") not in listed
    assert names.ingest_rejects_topic(world.project, "a") not in listed
