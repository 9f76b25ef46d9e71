"""The Kafka topics behind Setu's topics and subscriptions, created and deleted by AdminClient.

A Setu topic owns its ingest topic, main log and ingest reject topic; a subscription owns its
retry tiers ``rq.1..N`` and its DLQ, plus its consumer group. All of them get the Setu topic's
partition count (docs/design.md §1: a group lives on the same partition index everywhere) and
its retention. Deleting a topic deletes them all but its ingest topic, which is emptied and
kept, so that a topic created again under the name continues its offsets
(``state.retired_topics``).

Contract: every method blocks (call it from a worker thread) and is idempotent. ``ensure_*``
succeeds when the topics already exist with the right partition count and raises Conflict when
one exists with another count; ``delete_*`` succeeds when they are already gone. Kafka not
answering in time raises DependencyUnavailable; Kafka refusing the request for a reason of the
request (partitions, config) raises InvalidInput.
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import OFFSET_END, KafkaError, KafkaException, TopicCollection, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._config import AlterConfigOpType, ConfigEntry, ConfigResource
from confluent_kafka.cimpl import NewTopic

from setu import names
from setu.errors import Conflict, DependencyUnavailable, InvalidInput, SetuError
from setu.limits import DEFAULT_MAX_MESSAGE_BYTES, MessageLimits
from setu.model import Subscription, Topic
from state.group_offsets import ADMIN_REQUEST_TIMEOUT_S
from state.kafka_reader import COORDINATOR_MOVING, existing_topics

_REQUEST_ERRORS = frozenset(
    {
        KafkaError.INVALID_PARTITIONS,
        KafkaError.INVALID_CONFIG,
        KafkaError.POLICY_VIOLATION,
        KafkaError.INVALID_REPLICATION_FACTOR,
    }
)

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class TopicSpec:
    """One Kafka topic to create."""

    name: str
    partitions: int
    config: Mapping[str, str] = field(default_factory=dict)


def topic_config(
    retention_hours: int, replication_factor: int, max_message_bytes: int
) -> dict[str, str]:
    """Kafka topic config for every Kafka topic of one Setu topic.

    ``min.insync.replicas`` is 2 from three replicas up, so acks=all survives one broker loss
    without accepting writes held by a single replica.
    """
    return {
        "cleanup.policy": "delete",
        "retention.ms": str(retention_hours * 3_600_000),
        "min.insync.replicas": "2" if replication_factor >= 3 else "1",
        "max.message.bytes": str(MessageLimits(max_message_bytes).topic_bytes),
    }


def topic_specs(topic: Topic, replication_factor: int, max_message_bytes: int) -> list[TopicSpec]:
    """The ingest topic, main log, ingest reject topic and group-state changelog of
    ``topic``."""
    config = topic_config(topic.retention_hours, replication_factor, max_message_bytes)
    return [
        TopicSpec(names.ingest_topic(topic.project, topic.name), topic.partitions, config),
        TopicSpec(names.main_topic(topic.project, topic.name), topic.partitions, config),
        TopicSpec(names.ingest_rejects_topic(topic.project, topic.name), topic.partitions, config),
        groups_spec(topic, replication_factor, max_message_bytes),
    ]


def dead_letter_config(
    retention_hours: int | None, replication_factor: int, max_message_bytes: int
) -> dict[str, str]:
    """Kafka topic config of a DLQ: ``retention_hours`` None keeps dead letters for ever."""
    config = topic_config(1, replication_factor, max_message_bytes)
    config["retention.ms"] = "-1" if retention_hours is None else str(retention_hours * 3_600_000)
    return config


def subscription_specs(
    sub: Subscription,
    topic: Topic,
    replication_factor: int,
    max_message_bytes: int,
    dead_letter_retention_hours: int | None = None,
) -> list[TopicSpec]:
    """The retry tiers and DLQ of ``sub``, shaped like its topic, and its topic's group-state
    changelog (which the subscription's state lives in). The tiers keep the topic's retention,
    the DLQ ``dead_letter_retention_hours`` (None: for ever), so a parked message is never
    deleted with the messages that were delivered."""
    config = topic_config(topic.retention_hours, replication_factor, max_message_bytes)
    dlq = names.dlq_topic(sub.project, sub.name)
    return [
        *(
            TopicSpec(
                name,
                topic.partitions,
                config
                if name != dlq
                else dead_letter_config(
                    dead_letter_retention_hours, replication_factor, max_message_bytes
                ),
            )
            for name in names.subscription_topics(sub.project, sub.name, held_tiers(sub, topic))
        ),
        groups_spec(topic, replication_factor, max_message_bytes),
    ]


def held_tiers(sub: Subscription, topic: Topic) -> int:
    """How many retry tiers ``sub`` has in Kafka: its own number, and on a grouped topic at
    least one, where a scheduled message's group waits behind it (docs/scheduling.md)."""
    return max(sub.retry.tiers, 1 if topic.grouped else 0)


def changelog_config(replication_factor: int, max_message_bytes: int) -> dict[str, str]:
    """Kafka topic config of a subscription's group-state changelog: compacted, so it keeps
    the latest record of each key for as long as the subscription lives. A record stays
    uncompacted for an hour at least, so a takeover in that time still sees the record before
    one a stale worker wrote (state/changelog.py)."""
    return {
        "cleanup.policy": "compact",
        "min.compaction.lag.ms": str(3_600_000),
        "segment.ms": str(3_600_000),
        "delete.retention.ms": str(86_400_000),
        "min.insync.replicas": "2" if replication_factor >= 3 else "1",
        "max.message.bytes": str(MessageLimits(max_message_bytes).topic_bytes),
    }


def producer_marks_spec(replication_factor: int) -> TopicSpec:
    """The ingest job's producer marks changelog: compacted, one partition (it holds one
    record per producer and ingest partition)."""
    config = {
        "cleanup.policy": "compact",
        "min.insync.replicas": "2" if replication_factor >= 3 else "1",
    }
    return TopicSpec(names.PRODUCER_MARKS_TOPIC, 1, config)


def events_specs(replication_factor: int, max_message_bytes: int) -> list[TopicSpec]:
    """The operational events' topics (delivery/events.py): kept a week, like a topic's."""
    config = topic_config(168, replication_factor, max_message_bytes)
    return [
        TopicSpec(name, names.EVENTS_PARTITIONS, config)
        for name in (names.EVENTS_TOPIC, names.EVENTS_RETRY_TOPIC)
    ]


def groups_spec(topic: Topic, replication_factor: int, max_message_bytes: int) -> TopicSpec:
    """The group-state changelog of every subscription of ``topic`` (state/shared_changelog.py)."""
    return TopicSpec(
        names.groups_topic(topic.project, topic.name),
        topic.partitions,
        changelog_config(replication_factor, max_message_bytes),
    )


def owned_by_subscription(project: str, subscription: str) -> list[str]:
    """Every Kafka topic a subscription may own, including tiers dropped by an update and its
    changelog of the earlier layout."""
    return [
        *names.subscription_topics(project, subscription, names.MAX_RETRY_TIERS),
        names.state_topic(project, subscription),
    ]


def _error_of(future: concurrent.futures.Future[Any], timeout_s: float) -> KafkaError | None:
    try:
        future.result(timeout=max(timeout_s, 0.1))
    except KafkaException as exc:
        error = exc.args[0]
        if isinstance(error, KafkaError):
            return error
        raise DependencyUnavailable(f"Kafka admin request failed: {exc}") from exc
    except concurrent.futures.TimeoutError:
        raise DependencyUnavailable("Kafka did not answer the admin request in time") from None
    return None


def _translate(error: KafkaError, what: str) -> SetuError:
    if error.code() in _REQUEST_ERRORS:
        return InvalidInput(f"Kafka refused {what}: {error.str()}")
    return DependencyUnavailable(f"Kafka failed {what}: {error.str()}")


# Kafka's controller refuses a CreateTopics request of more than 10,000 partitions
# ("Excessively large number of partitions per request"): a worker taking over 1,000 new
# subscriptions asks for 30,000 at once. Smaller requests also keep each one's time short.
MAX_PARTITIONS_PER_REQUEST = 2_000
# A batch of subscriptions' topics that Kafka was too slow to show is asked this many times in
# all, the whole batch each time, before its subscriptions fail (their callers try again).
BATCH_ATTEMPTS = 2


def by_partitions(specs: Sequence[TopicSpec], limit: int) -> list[list[TopicSpec]]:
    """``specs`` in order, cut into runs of at most ``limit`` partitions (a topic with more
    is a run of its own)."""
    runs: list[list[TopicSpec]] = []
    size = 0
    for spec in specs:
        if not runs or size + spec.partitions > limit:
            runs.append([])
            size = 0
        runs[-1].append(spec)
        size += spec.partitions
    return runs


class KafkaTopics:
    """Creates and deletes the Kafka topics of Setu topics and subscriptions."""

    def __init__(
        self,
        bootstrap: str,
        *,
        replication_factor: int = 1,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        timeout_s: float = 15.0,
        client_config: Mapping[str, Any] | None = None,
        dead_letter_retention_hours: int | None = None,
        shared_log: tuple[str, int] | None = None,
    ) -> None:
        self._admin = AdminClient({"bootstrap.servers": bootstrap, **(client_config or {})})
        # (name, partitions) of the shared ingest log, which replaces each topic's own ingest
        # topic when SETU_INGEST_LOG=shared (decision 0010).
        self._shared_log = shared_log
        self._replication = replication_factor
        self._max_message_bytes = max_message_bytes
        self._dead_letter_retention_hours = dead_letter_retention_hours
        self._timeout_s = timeout_s

    def ensure_topic(self, topic: Topic) -> list[str]:
        """Makes the topic's Kafka topics; returns the names this call created (the others
        existed already)."""
        if self._shared_log is not None:
            own = topic_specs(topic, self._replication, self._max_message_bytes)[1:]
            return self.ensure_shared_log() + self._ensure(own)
        ingest = names.ingest_topic(topic.project, topic.name)
        kept = self.partition_count(ingest)
        if kept is not None and kept != topic.partitions:
            raise Conflict(
                f"topic {topic.name!r} existed before with {kept} partitions, and its ingest "
                f"log {ingest} is kept so that ingest never reads its offsets backwards: "
                f"create it with {kept} partitions, or under another name"
            )
        specs = topic_specs(topic, self._replication, self._max_message_bytes)
        created = self._ensure(specs)
        if kept is not None:
            self._configure(specs[0])
        return created

    def ensure_shared_log(self) -> list[str]:
        """Makes the shared ingest log if it is missing (nothing without one). One that exists
        is kept as it is: more partitions would send a group's next records to another
        partition than its earlier ones, which may not have been read yet (docs/ingest.md)."""
        if self._shared_log is None:
            return []
        name, partitions = self._shared_log
        kept = self.partition_count(name)
        if kept is None:
            return self._ensure([self._shared_log_spec()])
        if kept != partitions:
            log.warning(
                "the shared ingest log %s has %d partitions, SETU_INGEST_LOG_PARTITIONS says "
                "%d: kept as it is",
                name,
                kept,
                partitions,
            )
        return []

    def _shared_log_spec(self) -> TopicSpec:
        assert self._shared_log is not None
        name, partitions = self._shared_log
        # A week, the topics' default retention: records wait here only while ingest is down.
        config = topic_config(168, self._replication, self._max_message_bytes)
        return TopicSpec(name, partitions, config)

    def _configure(self, spec: TopicSpec) -> None:
        """Sets ``spec``'s config on its existing topic (a kept ingest topic takes the new
        topic's retention)."""
        self._configure_all([spec])

    def _configure_all(self, specs: Sequence[TopicSpec], *, skip_unknown: bool = False) -> None:
        """:meth:`_configure` for many topics in one request. ``skip_unknown``: a topic the
        broker says does not exist is left alone, not an error: one another process (the
        API, another worker) made a moment ago, with this config, which the broker does not
        serve yet (seen with a hundred subscriptions made at once)."""
        if not specs:
            return
        resources = [
            ConfigResource(
                ConfigResource.Type.TOPIC,
                spec.name,
                incremental_configs=[
                    ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)
                    for name, value in spec.config.items()
                ],
            )
            for spec in specs
        ]
        futures = self._admin.incremental_alter_configs(resources)
        deadline = time.monotonic() + self._timeout_s
        for resource, future in futures.items():
            error = _error_of(future, deadline - time.monotonic())
            if error is None:
                continue
            if skip_unknown and error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                log.info("%s is not served yet: its config is left as it was made", resource.name)
                continue
            raise _translate(error, f"to configure {resource.name}")

    def delete_topic(self, topic: Topic) -> None:
        """Deletes the topic's Kafka topics but its ingest topic, which is emptied instead
        (``state.retired_topics`` says why)."""
        ingest = names.ingest_topic(topic.project, topic.name)
        specs = topic_specs(topic, 1, self._max_message_bytes)
        self._delete([spec.name for spec in specs if spec.name != ingest])
        self.empty(ingest)

    def empty(self, kafka_topic: str) -> None:
        """Deletes every record ``kafka_topic`` holds now (its offsets go on from there); a
        topic that does not exist is left alone."""
        count = self.partition_count(kafka_topic)
        if count is None:
            return
        deadline = time.monotonic() + self._timeout_s
        futures = self._admin.delete_records(
            [TopicPartition(kafka_topic, p, OFFSET_END) for p in range(count)],
            request_timeout=self._timeout_s,
            operation_timeout=self._timeout_s,
        )
        for partition, future in futures.items():
            error = _error_of(future, deadline - time.monotonic())
            if error is not None:
                raise _translate(error, f"to empty {kafka_topic} [{partition.partition}]")

    def ensure_subscription(self, sub: Subscription, topic: Topic) -> list[str]:
        """Makes the subscription's retry and dead-letter topics; returns the names this call
        created."""
        specs = subscription_specs(
            sub,
            topic,
            self._replication,
            self._max_message_bytes,
            self._dead_letter_retention_hours,
        )
        created = self._ensure(specs, keep=True)
        dlq = names.dlq_topic(sub.project, sub.name)
        if dlq not in created:  # one made before: it takes the retention set now
            self._configure_all([next(s for s in specs if s.name == dlq)], skip_unknown=True)
        return created

    def ensure_subscriptions(
        self, subs: Sequence[tuple[Subscription, Topic]], *, state_only: bool = False
    ) -> dict[tuple[str, str], BaseException | None]:
        """:meth:`ensure_subscription` for many subscriptions at once (a worker taking over
        a hundred of them): one request learns which topics exist, the missing ones of all
        subscriptions are made in one more, and the DLQs take the dead-letter retention in a
        third. Returns, per (project, subscription), None or what failed it; when Kafka
        refuses the batch, each subscription is tried alone so one refusal (a topic with
        another partition count) fails only its own; when Kafka is too slow to show the
        topics, the whole batch is asked again (:data:`BATCH_ATTEMPTS`), then each
        subscription still missing some fails with that, for its caller to try again.
        What the batch made stays: deleting it pulled topics from under runners already
        using them (1,000 new subscriptions, each made by the API and by two workers at
        once). ``state_only``: only the group-state changelogs (:meth:`ensure_states`)."""
        specs = {
            (sub.project, sub.name): (
                [self._changelog_of(topic)]
                if state_only
                else subscription_specs(
                    sub,
                    topic,
                    self._replication,
                    self._max_message_bytes,
                    self._dead_letter_retention_hours,
                )
            )
            for sub, topic in subs
        }
        # The subscriptions of one topic share its changelog: asked for once.
        everything = list({spec.name: spec for group in specs.values() for spec in group}.values())
        out: dict[tuple[str, str], BaseException | None] = dict.fromkeys(specs)
        created: set[str] = set()
        for attempt in range(1, BATCH_ATTEMPTS + 1):
            usable = self._usable(everything)
            missing = [spec for spec in everything if spec.name not in usable]
            try:
                created.update(self._make(missing, keep=True) if missing else [])
                break
            except DependencyUnavailable as exc:
                # Kafka slow to show them (thousands of partitions made at once, by the API
                # and each worker): one subscription at a time would wait as long for each.
                if attempt < BATCH_ATTEMPTS:
                    log.warning(
                        "making the topics of %d subscriptions at once: %s; asking again",
                        len(specs),
                        exc,
                    )
                    continue
                usable = self._usable(everything)
                for key, group in specs.items():
                    if any(spec.name not in usable for spec in group):
                        out[key] = exc
                return out
            except Exception as exc:
                log.warning(
                    "making the topics of %d subscriptions at once failed (%s): one at a time",
                    len(specs),
                    exc,
                )
                incomplete = [
                    (sub, topic)
                    for sub, topic in subs
                    if any(spec.name not in usable for spec in specs[(sub.project, sub.name)])
                ]
                return {**out, **self._one_at_a_time(incomplete, state_only)}
        if created:
            log.info("made Kafka topics %s", sorted(created))
        dlqs = [
            spec
            for key, group in specs.items()
            for spec in group
            if spec.name == names.dlq_topic(*key) and spec.name not in created
        ]
        try:
            self._configure_all(dlqs, skip_unknown=True)
        except Exception as exc:
            for key in specs:
                out[key] = exc
        return out

    def ensure_states(
        self, subs: Sequence[tuple[Subscription, Topic]]
    ) -> dict[tuple[str, str], BaseException | frozenset[str]]:
        """Makes the group-state changelogs of ``subs`` where missing, as
        :meth:`ensure_subscriptions` does, and answers per subscription which of its retry
        tiers and DLQ do not exist: those are made at its first copy there
        (docs/decisions/0014-no-topics-until-a-failure.md). One request more, for all of them,
        asks which exist; a topic Kafka did not answer for fails its subscription, never
        counts as missing (a tier holding messages taken for one that does not exist would
        have them skipped)."""
        made = self.ensure_subscriptions(subs, state_only=True)
        own = {
            (sub.project, sub.name): names.subscription_topics(
                sub.project, sub.name, held_tiers(sub, topic)
            )
            for sub, topic in subs
        }
        out: dict[tuple[str, str], BaseException | frozenset[str]] = {}
        try:
            found = existing_topics(
                self._admin, [name for group in own.values() for name in group], self._timeout_s
            )
        except Exception as exc:
            return {key: exc for key in own}
        for key, group in own.items():
            error = made.get(key)
            out[key] = error if error is not None else frozenset(set(group) - found)
        return out

    def _changelog_of(self, topic: Topic) -> TopicSpec:
        return groups_spec(topic, self._replication, self._max_message_bytes)

    def _one_at_a_time(
        self, subs: Sequence[tuple[Subscription, Topic]], state_only: bool = False
    ) -> dict[tuple[str, str], BaseException | None]:
        """Each of ``subs`` ensured alone, so one refusal fails only its own."""
        out: dict[tuple[str, str], BaseException | None] = {}
        for sub, topic in subs:
            try:
                if state_only:
                    self.ensure_groups(topic)
                else:
                    self.ensure_subscription(sub, topic)
                out[(sub.project, sub.name)] = None
            except Exception as exc:
                out[(sub.project, sub.name)] = exc
        return out

    def ensure_groups(self, topic: Topic) -> list[str]:
        """Makes the topic's group-state changelog if it is missing (a topic created before
        it was made with the topic); returns what it created."""
        return self._ensure([self._changelog_of(topic)], keep=True)

    def ensure_producer_marks(self) -> list[str]:
        """Makes the ingest job's producer marks changelog if it is missing; returns what it
        created."""
        return self._ensure([producer_marks_spec(self._replication)])

    def ensure_events(self) -> list[str]:
        """Makes the operational events' topics if they are missing; returns what it created."""
        return self._ensure(events_specs(self._replication, self._max_message_bytes), keep=True)

    def retention_ms(self, kafka_topic: str) -> int | None:
        """The topic's ``retention.ms`` as the broker has it; None: kept for ever."""
        resource = ConfigResource(ConfigResource.Type.TOPIC, kafka_topic)
        future = self._admin.describe_configs([resource])[resource]
        try:
            configs = future.result(timeout=self._timeout_s)
        except KafkaException as exc:
            raise DependencyUnavailable(f"Kafka: {exc}") from exc
        entry = configs.get("retention.ms")
        value = int(entry.value) if entry is not None and entry.value is not None else -1
        return None if value < 0 else value

    def remove(self, kafka_topics: Sequence[str]) -> None:
        """Deletes ``kafka_topics`` (those a failed create made), waiting until they are gone."""
        if kafka_topics:
            self._delete(kafka_topics)

    def delete_subscription(self, project: str, subscription: str) -> None:
        """Deletes the consumer group (waiting for workers to leave it), then every topic."""
        self._delete_group(names.consumer_group(project, subscription))
        self._delete(owned_by_subscription(project, subscription))

    def broker_count(self, timeout_s: float) -> int:
        """Brokers in a fresh metadata answer; raises DependencyUnavailable when none comes."""
        try:
            return len(self._admin.list_topics(timeout=timeout_s).brokers)
        except KafkaException as exc:
            raise DependencyUnavailable(f"Kafka metadata: {exc}") from exc

    def partition_count(self, kafka_topic: str, timeout_s: float | None = None) -> int | None:
        """Partitions of ``kafka_topic``; None when the broker says it does not exist."""
        try:
            meta = self._admin.list_topics(topic=kafka_topic, timeout=timeout_s or self._timeout_s)
        except KafkaException as exc:
            raise DependencyUnavailable(f"Kafka metadata: {exc}") from exc
        described = meta.topics.get(kafka_topic)
        if described is None or described.error is not None:
            return None
        return len(described.partitions)

    def _ensure(self, specs: Sequence[TopicSpec], *, keep: bool = False) -> list[str]:
        """Creates the topics of ``specs`` that do not exist yet and waits until all are
        usable; returns the names it created. When it fails part-way, it deletes what it
        created (best effort) before raising, so a failed request leaves nothing behind;
        with ``keep``, what it made stays (a subscription's topics: the subscription
        exists, and another process may be using them already)."""
        if self._all_usable(specs):
            return []
        return self._make(specs, keep=keep)

    def _make(self, specs: Sequence[TopicSpec], *, keep: bool = False) -> list[str]:
        """:meth:`_ensure` without first asking whether all exist (the caller just did)."""
        created: list[str] = []
        try:
            self._create_all(specs, created)
        except BaseException:
            if created and not keep:
                try:
                    self._delete(created)
                except Exception:
                    log.exception("could not remove Kafka topics %s after a failed create", created)
            raise
        return created

    def _create_all(self, specs: Sequence[TopicSpec], created: list[str]) -> None:
        """Creates ``specs`` in requests of at most :data:`MAX_PARTITIONS_PER_REQUEST`
        partitions, each given the timeout, and waits until all are usable."""
        for chunk in by_partitions(specs, MAX_PARTITIONS_PER_REQUEST):
            self._create_chunk(chunk, created)

    def _create_chunk(self, specs: Sequence[TopicSpec], created: list[str]) -> None:
        deadline = time.monotonic() + self._timeout_s
        pending = list(specs)
        while pending:
            futures = self._admin.create_topics(
                [
                    NewTopic(s.name, s.partitions, self._replication, config=dict(s.config))
                    for s in pending
                ],
                request_timeout=self._timeout_s,
            )
            existing = []
            for spec in pending:
                error = _error_of(futures[spec.name], deadline - time.monotonic())
                if error is None:
                    created.append(spec.name)
                    continue
                if error.code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise _translate(error, f"to create {spec.name}")
                existing.append(spec)
            # Made by another process (the API and every worker may make a new
            # subscription's topics at once), or being deleted: their counts in one ask.
            counts = self._counts([spec.name for spec in existing])
            waiting = []
            for spec in existing:
                count = counts.get(spec.name)
                if count is None:
                    # Still being deleted, or not yet in this broker's metadata: try again.
                    waiting.append(spec)
                elif count != spec.partitions:
                    raise Conflict(
                        f"Kafka topic {spec.name} already exists with {count} partitions, "
                        f"not {spec.partitions}"
                    )
            if waiting and time.monotonic() > deadline:
                raise DependencyUnavailable(f"Kafka topics {[s.name for s in waiting]} not ready")
            if waiting:
                time.sleep(0.2)
            pending = waiting
        self._await_visible(specs, deadline)

    def _counts(self, kafka_topics: Sequence[str]) -> dict[str, int]:
        """The partition counts of those of ``kafka_topics`` the broker describes, in one
        request; a topic it does not (yet) know is left out."""
        try:
            described = self._described(kafka_topics)
        except KafkaException as exc:
            raise DependencyUnavailable(f"Kafka metadata: {exc}") from exc
        return {name: len(topic.partitions) for name, topic in described.items()}

    def _described(self, kafka_topics: Sequence[str]) -> dict[str, Any]:
        """Each of ``kafka_topics`` the broker describes, asked in one request; one it does
        not know, or does not answer for in time, is left out. Raises KafkaException when
        the request cannot be made."""
        if not kafka_topics:
            return {}
        futures = self._admin.describe_topics(
            TopicCollection(list(dict.fromkeys(kafka_topics))), request_timeout=self._timeout_s
        )
        described = {}
        for name, future in futures.items():
            try:
                described[name] = future.result(timeout=self._timeout_s)
            except (KafkaException, concurrent.futures.TimeoutError):
                continue
        return described

    def _all_usable(self, specs: Sequence[TopicSpec]) -> bool:
        """Whether every topic of ``specs`` exists with its partition count and a leader for
        each partition (a worker asks this before each subscription it runs: the usual
        answer is yes). Any doubt says no, and the caller takes the long way."""
        return len(self._usable(specs)) == len({spec.name for spec in specs})

    def _usable(self, specs: Sequence[TopicSpec]) -> set[str]:
        """The names of ``specs`` whose topics exist with their partition count and a leader
        for each partition, asked in one request; a topic in doubt is left out."""
        try:
            described = self._described([spec.name for spec in specs])
        except KafkaException:
            return set()
        return {
            spec.name
            for spec in specs
            if (topic := described.get(spec.name)) is not None
            and len(topic.partitions) == spec.partitions
            and all(p.leader is not None for p in topic.partitions)
        }

    def _await_visible(self, specs: Sequence[TopicSpec], deadline: float) -> None:
        """Waits until metadata shows every topic with a leader for each partition, so a 2xx
        means usable now: asked for all of them at once, again for those not yet usable."""
        pending = list(specs)
        while pending:
            usable = self._usable(pending)
            pending = [spec for spec in pending if spec.name not in usable]
            if not pending:
                return
            if time.monotonic() > deadline:
                shown = ", ".join(spec.name for spec in pending[:5])
                raise DependencyUnavailable(f"Kafka topics did not appear in time: {shown}")
            time.sleep(0.05)

    def _delete(self, kafka_topics: Sequence[str]) -> None:
        deadline = time.monotonic() + self._timeout_s
        futures = self._admin.delete_topics(
            list(kafka_topics), request_timeout=self._timeout_s, operation_timeout=self._timeout_s
        )
        for name, future in futures.items():
            error = _error_of(future, deadline - time.monotonic())
            if error is not None and error.code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                raise _translate(error, f"to delete {name}")
        # Metadata lags the controller; wait so a 2xx means gone (and re-creatable) now.
        for name in kafka_topics:
            while self.partition_count(name, max(deadline - time.monotonic(), 0.5)) is not None:
                if time.monotonic() > deadline:
                    raise DependencyUnavailable(f"Kafka topic {name} did not go away in time")
                time.sleep(0.05)

    def _delete_group(self, group: str) -> None:
        deadline = time.monotonic() + self._timeout_s
        while True:
            # A group request's own deadline far above any outage: see ADMIN_REQUEST_TIMEOUT_S.
            futures = self._admin.delete_consumer_groups(
                [group], request_timeout=ADMIN_REQUEST_TIMEOUT_S
            )
            error = _error_of(futures[group], deadline - time.monotonic())
            if error is None or error.code() == KafkaError.GROUP_ID_NOT_FOUND:
                return
            # A coordinator that moved or is still loading its groups (a broker just started
            # or failed over) answers the same request soon: asked again until the deadline.
            moving = error.code() in COORDINATOR_MOVING
            if error.code() != KafkaError.NON_EMPTY_GROUP and not moving:
                raise _translate(error, f"to delete consumer group {group}")
            if time.monotonic() > deadline:
                if moving:
                    raise _translate(error, f"to delete consumer group {group}")
                raise Conflict(
                    f"consumer group {group} still has members; workers leave it once they "
                    "see the deletion, so repeat the DELETE shortly"
                )
            time.sleep(0.2 if moving else 0.5)
