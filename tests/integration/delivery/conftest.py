"""A real world for delivery tests: Kafka topics on the shared broker, a SQLite metadata store,
Redis, a webhook receiver on 127.0.0.1 whose answers each test chooses, and a delivery worker
(in a thread, or as a ``setu deliver`` process that a test may kill)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from confluent_kafka import Producer

from setu.model import Project
from state import keys, migrate
from state.kafka_admin import KafkaTopics
from state.metadata import MetadataStore
from state.sealing import Sealer
from tests.integration.delivery.support import (
    ProcessWorker,
    Receiver,
    ThreadWorker,
    World,
    delete_subscription_group,
    served_receiver,
    serving_api,
)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with served_receiver() as rec:
        yield rec


@pytest.fixture
def world(tmp_path: Path, kafka_bootstrap: str, redis_url: str) -> Iterator[World]:
    database_url = f"sqlite:///{tmp_path / 'setu.db'}"
    migrate.upgrade(database_url)
    project = f"d{uuid.uuid4().hex[:10]}"
    secret_key = Sealer.new_key()
    store = MetadataStore(database_url, Sealer([secret_key]))
    store.create_project(Project(project))
    topics = KafkaTopics(kafka_bootstrap)
    producer = Producer(
        {
            "bootstrap.servers": kafka_bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "partitioner": "murmur2_random",
        }
    )
    w = World(
        project, kafka_bootstrap, redis_url, database_url, store, topics, producer, secret_key
    )
    try:
        yield w
    finally:
        client = w.redis()
        for sub in store.list_subscriptions(project):
            found = list(client.scan_iter(match=keys.subscription_pattern(project, sub.name)))
            if found:
                client.delete(*found)
            delete_subscription_group(topics, project, sub.name)
        for topic in store.list_topics(project):
            topics.delete_topic(topic)
        client.close()
        store.close()


@pytest.fixture
def start_worker(world: World) -> Iterator[Callable[..., ThreadWorker]]:
    workers: list[ThreadWorker] = []

    def start(**overrides: Any) -> ThreadWorker:
        worker = ThreadWorker(world.settings(**overrides), world.store)
        workers.append(worker)
        return worker

    yield start
    for worker in workers:
        worker.stop()


@pytest.fixture
def start_process(world: World, tmp_path: Path) -> Iterator[Callable[..., ProcessWorker]]:
    processes: list[ProcessWorker] = []

    def start(**overrides: Any) -> ProcessWorker:
        proc = ProcessWorker(world.settings(**overrides), tmp_path / "worker.log")
        processes.append(proc)
        return proc

    yield start
    for proc in processes:
        if proc.process.poll() is None:
            proc.kill()


@pytest.fixture
def api(world: World) -> Iterator[httpx.Client]:
    """The HTTP API on the test's database, Kafka and Redis, served by uvicorn in a thread."""
    with serving_api(world) as client:
        yield client
