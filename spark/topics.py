"""Keeps every ingest topic's main log and reject topic in place while the ingest job runs,
and tells the job what each main topic takes and what each reject topic holds.

The job writes all topics through one query. A batch holding messages of a topic whose main
topic is gone (deleted by hand, say) cannot finish: the Kafka sink waits for the topic, and every
other topic waits behind it. :class:`MainTopicGuard` watches the broker's topic list from a
thread of the driver's own. When an ingest topic the job reads has had no main topic for
``grace_s``, it creates the main topic again, shaped like the ingest topic (the control plane
makes both alike: same partitions, replicas and topic config). Nothing is deleted, and the
messages still to be written land in the new main topic. Any messages the deleted topic held
are gone with it.

With the shared ingest log (decision 0010) a topic has no ingest topic of its own: the guard
then looks after the topics whose records the job has read (``seen``), shaping a missing main
topic like the topic's reject topic, which the control plane makes alike too.

The grace period keeps the guard out of the control plane's way: the API creates and deletes a
topic's ingest and main topics together, so one of them is missing without the other only for
moments.

On each look the guard also creates a missing ingest reject topic (topics made before reject
topics existed), reads every main topic's ``max.message.bytes`` (:meth:`MainTopicGuard.limits`,
which :mod:`spark.rejects` checks rows against) and how many records each reject topic holds
(:meth:`MainTopicGuard.rejects`, a metric).
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Collection, Mapping

from confluent_kafka import KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._config import ConfigResource, ConfigSource
from confluent_kafka.admin._listoffsets import OffsetSpec
from confluent_kafka.admin._metadata import TopicMetadata
from confluent_kafka.cimpl import NewTopic

from setu.names import ingest_rejects_topic, main_topic, parse_ingest_topic

log = logging.getLogger(__name__)

# How often the guard reads the main topics' limits and the reject topics' sizes.
LOOK_EVERY_S = 10.0


def looked_after(
    topics: Collection[str], pattern: str, seen: Collection[str] = ()
) -> dict[str, str]:
    """The ingest topics the guard looks after, each with the Kafka topic a missing main topic
    or reject topic is shaped like: each topic's own ingest topic that ``pattern`` matches
    (itself), and each ingest topic of ``seen`` (read from the shared log) that has no topic of
    its own but a reject topic (that one)."""
    matcher = re.compile(pattern)
    out: dict[str, str] = {}
    for topic in topics:
        if matcher.search(topic) is None:
            continue
        try:
            parse_ingest_topic(topic)
        except ValueError:
            continue  # the shared ingest log
        out[topic] = topic
    for ingest in seen:
        if ingest in out:
            continue
        try:
            rejects = ingest_rejects_topic(*parse_ingest_topic(ingest))
        except ValueError:
            continue
        if rejects in topics:
            out[ingest] = rejects
    return out


def orphaned(
    topics: set[str], ingests: Collection[str], missing_since: Mapping[str, float], now: float
) -> dict[str, float]:
    """Of ``ingests``, those whose main topic is not in ``topics``, with the time each was
    first seen so (kept from ``missing_since``, else ``now``)."""
    out: dict[str, float] = {}
    for topic in ingests:
        if main_topic(*parse_ingest_topic(topic)) not in topics:
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
        retired: Callable[[], frozenset[str]] = frozenset,
        client_config: Mapping[str, str] | None = None,
        seen: Callable[[], Collection[str]] = frozenset,
    ) -> None:
        """``retired`` tells the ingest topics of deleted topics, which the guard leaves alone
        (state.retired_topics); ``client_config`` how to reach the broker (docs/security.md
        §5); ``seen`` the ingest topics whose records the job read (the shared log's topics)."""
        self._seen = seen
        self._admin = AdminClient({"bootstrap.servers": bootstrap, **(client_config or {})})
        self._pattern = pattern
        self._interval_s = interval_s
        self._looked_at = float("-inf")
        self._limits_of: dict[str, str] = {}
        self._grace_s = grace_s
        self._on_recreated = on_recreated
        self._retired = retired
        self._missing_since: dict[str, float] = {}
        self._limits: dict[str, int] = {}
        self._rejects: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="main-topic-guard", daemon=True)

    def start(self) -> MainTopicGuard:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def limits(self) -> dict[str, int]:
        """Each main topic's ``max.message.bytes`` as last read (main topic -> bytes)."""
        return self._limits

    def rejects(self) -> dict[str, int]:
        """Records each ingest topic's reject topic holds, as last read (ingest topic -> n)."""
        return self._rejects

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
        retired = self._retired()
        topics = {name: t for name, t in meta.topics.items() if name not in retired}
        ingests = looked_after(topics, self._pattern, set(self._seen()) - retired)
        self._missing_since = orphaned(set(topics), ingests, self._missing_since, now)
        if now - self._looked_at >= LOOK_EVERY_S or set(ingests) != set(self._limits_of):
            # Every topic's config and reject offsets: thousands of requests with many topics
            # (a tenth of a core every 2 s at 200 topics), so less often, and at once for a
            # topic that is new to the guard.
            self._look_at_rejects_and_limits(topics, ingests)
            self._looked_at, self._limits_of = now, dict(ingests)
        created = []
        for ingest, since in list(self._missing_since.items()):
            if now - since < self._grace_s:
                continue
            model = ingests[ingest]
            described = topics[model]
            if described.error is not None or not described.partitions:
                continue
            self._recreate(ingest, model, described)
            created.append(main_topic(*parse_ingest_topic(ingest)))
            del self._missing_since[ingest]
        return created

    def _look_at_rejects_and_limits(
        self, topics: Mapping[str, TopicMetadata], ingests: Mapping[str, str]
    ) -> None:
        for ingest, model in ingests.items():
            rejects = ingest_rejects_topic(*parse_ingest_topic(ingest))
            if rejects not in topics:
                create_like(self._admin, rejects, model, topics[model])
                log.info("created the ingest reject topic %s", rejects)
        mains = [m for m in (main_topic(*parse_ingest_topic(i)) for i in ingests) if m in topics]
        self._limits = topic_limits(self._admin, mains)
        held = {i: ingest_rejects_topic(*parse_ingest_topic(i)) for i in ingests}
        counts = records_held(self._admin, {t: topics[t] for t in held.values() if t in topics})
        held_now = {i: counts[r] for i, r in held.items() if r in counts}
        for ingest, now_held in held_now.items():
            before = self._rejects.get(ingest)
            if before is not None and now_held > before:
                log.error(
                    "%d record(s) of %s were set aside in %s (README: rejected records)",
                    now_held - before,
                    main_topic(*parse_ingest_topic(ingest)),
                    held[ingest],
                )
        self._rejects = held_now

    def _recreate(self, ingest: str, model: str, described: TopicMetadata) -> None:
        partitions = described.partitions
        replicas = len(next(iter(partitions.values())).replicas)
        target = main_topic(*parse_ingest_topic(ingest))
        try:
            create_like(self._admin, target, model, described)
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


def create_like(
    admin: AdminClient, target: str, source: str, described: TopicMetadata | None = None
) -> None:
    """Creates ``target`` shaped like ``source``: its partitions, replicas and topic-level
    config (what the control plane set). A ``target`` that exists already is left alone."""
    if described is None:
        described = admin.list_topics(source, timeout=10).topics[source]
    partitions = described.partitions
    if described.error is not None or not partitions:
        raise KafkaException(f"cannot describe {source}: {described.error}")
    replicas = len(next(iter(partitions.values())).replicas)
    config = explicit_config(admin, source)
    future = admin.create_topics([NewTopic(target, len(partitions), replicas, config=config)])
    try:
        future[target].result(timeout=30)
    except KafkaException as exc:
        if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
            raise


def topic_limits(admin: AdminClient, topics: list[str]) -> dict[str, int]:
    """The ``max.message.bytes`` of each of ``topics`` (those that can be read)."""
    if not topics:
        return {}
    resources = [ConfigResource(ConfigResource.Type.TOPIC, t) for t in topics]
    out = {}
    for resource, future in admin.describe_configs(resources).items():
        try:
            entry = future.result(timeout=30).get("max.message.bytes")
        except KafkaException:
            continue  # deleted in the meantime
        if entry is not None and entry.value is not None:
            out[resource.name] = int(entry.value)
    return out


def records_held(admin: AdminClient, topics: Mapping[str, TopicMetadata]) -> dict[str, int]:
    """How many records each of ``topics`` (as just listed) holds now: latest minus earliest
    offset, over the partitions that answered both."""
    partitions = [TopicPartition(t, p) for t, meta in topics.items() for p in meta.partitions]
    if not partitions:
        return dict.fromkeys(topics, 0)
    offsets: list[dict[TopicPartition, int]] = []
    latest, earliest = OffsetSpec.latest(), OffsetSpec.earliest()  # type: ignore[no-untyped-call]
    for spec in (latest, earliest):
        found = {}
        requests = {tp: spec for tp in partitions}
        for tp, future in admin.list_offsets(requests, request_timeout=10).items():
            try:
                found[tp] = future.result().offset
            except KafkaException:
                continue
        offsets.append(found)
    held = dict.fromkeys(topics, 0)
    ends, starts = offsets
    for tp, end in ends.items():
        if tp in starts:
            held[tp.topic] += end - starts[tp]
    return held


def explicit_config(admin: AdminClient, topic: str) -> dict[str, str]:
    """The topic-level settings of ``topic`` (what its creator set, not broker defaults)."""
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    entries = admin.describe_configs([resource])[resource].result(timeout=30)
    return {
        name: entry.value
        for name, entry in entries.items()
        if entry.source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value and entry.value is not None
    }
