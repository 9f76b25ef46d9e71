"""Keeps every ingest topic's main log in place while the ingest job runs.

The job writes all topics through one query. A batch holding messages of a topic whose main
topic is gone (deleted by hand, say) cannot finish: the Kafka sink waits for the topic, and every
other topic waits behind it. :class:`MainTopicGuard` watches the broker's topic list from a
thread of the driver's own. When an ingest topic the job reads has had no main topic for
``grace_s``, it creates the main topic again, shaped like the ingest topic (the control plane
makes both alike: same partitions, replicas and topic config). Nothing is deleted, and the
messages still to be written land in the new main topic. Any messages the deleted topic held
are gone with it.

The grace period keeps the guard out of the control plane's way: the API creates and deletes a
topic's ingest and main topics together, so one of them is missing without the other only for
moments.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Mapping

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._config import ConfigResource, ConfigSource
from confluent_kafka.admin._metadata import TopicMetadata
from confluent_kafka.cimpl import NewTopic

from setu.names import main_topic, parse_ingest_topic

log = logging.getLogger(__name__)


def orphaned(
    topics: set[str], pattern: str, missing_since: Mapping[str, float], now: float
) -> dict[str, float]:
    """Ingest topics matching ``pattern`` whose main topic is not in ``topics``, with the time
    each was first seen so (kept from ``missing_since``, else ``now``)."""
    matcher = re.compile(pattern)
    out: dict[str, float] = {}
    for topic in topics:
        if matcher.search(topic) is None:
            continue
        project, name = parse_ingest_topic(topic)
        if main_topic(project, name) not in topics:
            out[topic] = missing_since.get(topic, now)
    return out


class MainTopicGuard:
    """See the module doc. :meth:`start` runs it; :meth:`stop` ends it."""

    def __init__(
        self,
        bootstrap: str,
        pattern: str,
        interval_s: float = 2.0,
        grace_s: float = 10.0,
        on_recreated: Callable[[str], None] = lambda topic: None,
    ) -> None:
        self._admin = AdminClient({"bootstrap.servers": bootstrap})
        self._pattern = pattern
        self._interval_s = interval_s
        self._grace_s = grace_s
        self._on_recreated = on_recreated
        self._missing_since: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="main-topic-guard", daemon=True)

    def start(self) -> MainTopicGuard:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                self.check()
            except KafkaException as exc:
                log.warning("could not check the main topics: %s", exc)
            except Exception:
                log.exception("main topic check failed")

    def check(self) -> list[str]:
        """One look at the broker; returns the main topics created again."""
        meta = self._admin.list_topics(timeout=10)
        now = time.monotonic()
        self._missing_since = orphaned(set(meta.topics), self._pattern, self._missing_since, now)
        created = []
        for ingest, since in list(self._missing_since.items()):
            if now - since < self._grace_s:
                continue
            described = meta.topics[ingest]
            if described.error is not None or not described.partitions:
                continue
            self._recreate(ingest, described)
            created.append(main_topic(*parse_ingest_topic(ingest)))
            del self._missing_since[ingest]
        return created

    def _recreate(self, ingest: str, described: TopicMetadata) -> None:
        partitions = described.partitions
        replicas = len(next(iter(partitions.values())).replicas)
        config = self._explicit_config(ingest)
        target = main_topic(*parse_ingest_topic(ingest))
        future = self._admin.create_topics(
            [NewTopic(target, len(partitions), replicas, config=config)]
        )
        try:
            future[target].result(timeout=30)
        except KafkaException as exc:
            log.warning("could not create the missing main topic %s: %s", target, exc)
            return
        log.error(
            "main topic %s was missing while its ingest topic %s exists; created it again "
            "(%d partitions, %d replicas) so that ingest goes on: messages it held are lost",
            target,
            ingest,
            len(partitions),
            replicas,
        )
        self._on_recreated(target)

    def _explicit_config(self, topic: str) -> dict[str, str]:
        """The topic-level settings of ``topic`` (what its creator set, not broker defaults)."""
        resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
        entries = self._admin.describe_configs([resource])[resource].result(timeout=30)
        return {
            name: entry.value
            for name, entry in entries.items()
            if entry.source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value and entry.value is not None
        }
