"""Every Redis key Setu uses, built in one place.

Keys carry ``{project}:{subscription}`` inside a Redis Cluster hash tag so all keys of one
subscription live in one slot and Lua scripts may touch several of them.
"""

from __future__ import annotations

PREFIX = "setu"


def _sub(project: str, subscription: str) -> str:
    return f"{PREFIX}:{{{project}.{subscription}}}"


def subscription_pattern(project: str, subscription: str) -> str:
    """SCAN pattern matching every key of one subscription (used when it is deleted)."""
    return f"{_sub(project, subscription)}:*"


def group_state(project: str, subscription: str, group_id: str) -> str:
    """Hash of one unhealthy group: tier, head message id, parked count. Absent when healthy."""
    return f"{_sub(project, subscription)}:group:{group_id}"


def failed_groups(project: str, subscription: str) -> str:
    """Set of the group ids that currently have a group_state key."""
    return f"{_sub(project, subscription)}:failed"


def delivered(project: str, subscription: str, partition: int) -> str:
    """Sorted set of the records of one partition index whose outcome is durable (delivered with
    a recorded 2xx, moved, parked) above the committed offsets, so replays skip them. Member
    ``{tier}:{offset}``, score ``tier * 2**48 + offset`` (see setu.ordering.tiers)."""
    return f"{_sub(project, subscription)}:delivered:{partition}"


def unhealthy(project: str, subscription: str, standing: str) -> str:
    """Sorted set of the failed groups that stand ``retrying`` or ``dead_lettered``, scored by
    when each became unhealthy (ms): the operators' index, paged oldest first."""
    return f"{_sub(project, subscription)}:unhealthy:{standing}"


def partition_failed(project: str, subscription: str, partition: int) -> str:
    """Set of the failed group ids (those with a group_state key) on one partition index."""
    return f"{_sub(project, subscription)}:failed:{partition}"


def release_requests(project: str, subscription: str, partition: int) -> str:
    """Set of group ids an operator unsidelined that the owning worker has not yet taken up."""
    return f"{_sub(project, subscription)}:release:{partition}"


def release_version(project: str, subscription: str) -> str:
    """Integer raised with every release request of the subscription (any partition), so a
    worker reads one key to know whether there is anything to pick up (delivery/watch.py)."""
    return f"{_sub(project, subscription)}:release-version"


def pending_releases(project: str, subscription: str, partition: int) -> str:
    """Sorted set of DLQ offsets of single (unordered) dead letters to deliver again."""
    return f"{_sub(project, subscription)}:pending:{partition}"


def redelivered(project: str, subscription: str, partition: int) -> str:
    """Sorted set (score = offset) of the DLQ offsets of single dead letters delivered again
    after an unsideline, or sent through the retry tiers again; DLQ browsing hides them.
    Trimmed below the DLQ's first offset. (A group's letters need no entry: its state says
    which are still live.)"""
    return f"{_sub(project, subscription)}:redelivered:{partition}"


def legacy_unsidelined(project: str, subscription: str, partition: int) -> str:
    """The plain set an older version kept instead of :func:`redelivered`; adopted, then gone."""
    return f"{_sub(project, subscription)}:unsidelined:{partition}"


def owner_epoch(project: str, subscription: str, partition: int) -> str:
    """Integer bumped by every worker that takes over the partition index; group-state writes
    name the epoch they were decided under and are refused once it moved on."""
    return f"{_sub(project, subscription)}:owner:{partition}"


def owner_writes(project: str, subscription: str, partition: int) -> str:
    """Integer: the state writes applied since the partition's owner claimed it. An owner
    that made more than Redis counts knows Redis lost some (docs/design.md §4)."""
    return f"{_sub(project, subscription)}:writes:{partition}"


def state_loaded(project: str, subscription: str) -> str:
    """Hash partition -> owner epoch: the partitions whose group state Redis holds in full
    (loaded or rebuilt from the changelog by their owner, or new). A partition missing here
    is being rebuilt, or waits for an owner to rebuild it (the views say ``rebuilding``)."""
    return f"{_sub(project, subscription)}:loaded"


def fences(project: str, subscription: str, partition: int) -> str:
    """Hash owner epoch -> where each retry tier and the DLQ ended when that epoch took over
    (``tier:offset,...``): copies of older epochs from there on were written by a worker
    that had lost the partition, and are ignored."""
    return f"{_sub(project, subscription)}:fences:{partition}"


def seeks_applied(project: str, subscription: str) -> str:
    """Hash partition -> the subscription's seek_generation last applied to that partition."""
    return f"{_sub(project, subscription)}:seeks"


def counters(project: str, subscription: str) -> str:
    """Hash of lifetime counters: delivered_total, dead_lettered, retried."""
    return f"{_sub(project, subscription)}:counters"


def worker_stats(project: str, subscription: str) -> str:
    """Hash worker_id -> JSON of that worker's live figures (in_flight, retry_backlog, at)."""
    return f"{_sub(project, subscription)}:workers"


def delivery_slots(project: str, subscription: str) -> str:
    """Hash worker_id -> "demand,held,expires_ms": the workers' shares of ``max_in_flight``
    (state/delivery_budget.py)."""
    return f"{_sub(project, subscription)}:slots"


def delivery_rate(project: str, subscription: str) -> str:
    """Token bucket (tokens, at) of the subscription's ``rate_limit_per_second``, shared by
    its workers (state/delivery_budget.py)."""
    return f"{_sub(project, subscription)}:rate"


def breaker(project: str, subscription: str) -> str:
    """JSON (state, since_ms, last_error, outage_since_ms) while some worker's circuit breaker
    for the subscription's endpoint is open; absent otherwise (delivery/breaker.py)."""
    return f"{_sub(project, subscription)}:breaker"


def stop_confirmations(project: str, subscription: str) -> str:
    """Hash worker_id -> JSON of how that worker carried out the latest stop it saw (mode,
    when it was asked, when it had stopped, calls it abandoned): docs/policies.md §6."""
    return f"{_sub(project, subscription)}:stopped"


def subscriptions_changed() -> str:
    """Integer the API raises after each change to a subscription's record (made, updated,
    started, stopped, paused, resumed, deleted). Workers read it once a second and list the
    subscriptions at once when it moved, rather than at their next regular listing
    (delivery/watch.py); losing it loses nothing but that head start."""
    return f"{PREFIX}:subscriptions:changed"


def producer_marks(project: str, topic: str) -> str:
    """Hash producer_id -> "<topic incarnation>:<highest sequence id accepted into the main
    log>" (written by ingest; read with :mod:`state.producer_marks`)."""
    return f"{PREFIX}:producers:{{{project}.{topic}}}"


def producer_marks_loaded() -> str:
    """String present while Redis holds every producer mark the ingest job has: set by the job
    once it published them all (at its start, and again within a second whenever it finds
    this key gone). Without it, ``GET …/producers/{id}`` and streaming NOTIFY answer 503
    rather than a point that Redis may have forgotten (docs/design.md §4)."""
    return f"{PREFIX}:producers:loaded"


def worker_heartbeat(worker_id: str) -> str:
    """String with a TTL: present while the delivery worker is alive (for `--check` probes)."""
    return f"{PREFIX}:heartbeat:{worker_id}"


def ingest_status() -> str:
    """Hash of the ingest job's state, heartbeat and lag (state.ingest_status)."""
    return f"{PREFIX}:ingest:status"


def retired_ingest_topics() -> str:
    """Set of the ingest topics of deleted topics: kept in Kafka (emptied) so that a topic
    created again under the name continues their offsets, and skipped by the ingest job
    (``state.retired_topics``)."""
    return f"{PREFIX}:ingest:retired"


def produce_quota(project: str, kind: str) -> str:
    """Token bucket of a project's produce quota, ``kind`` ``messages`` or ``bytes``; both
    buckets of a project share a hash tag, so one script takes from both."""
    return f"{PREFIX}:{{quota.{project}}}:{kind}"


def attempts(project: str, subscription: str, hour: int) -> str:
    """Hash of the attempt log entries written in one hour (``ms // 3,600,000``): field the
    message id, value its entries of that hour, one JSON line each (state/attempt_log.py)."""
    return f"{_sub(project, subscription)}:attempts:{hour}"


def stream_points(project: str, topic: str) -> str:
    """Hash producer_id -> ``"<topic incarnation>:<highest sequence id>"`` such that the
    producer's streaming session had every sequence up to it acknowledged by Kafka in the ingest
    topic (state/stream_sessions.py; the same format and raise as :func:`producer_marks`)."""
    return f"{PREFIX}:streams:{{{project}.{topic}}}"


def stream_lease(project: str, topic: str, producer: str) -> str:
    """String with a TTL: the token of the streaming session that writes the stream
    ``{project}/{topic}/{producer}`` (one writer per stream, docs/streaming.md)."""
    return f"{PREFIX}:stream-lease:{{{project}.{topic}}}:{producer}"


def stream_lease_pattern() -> str:
    """SCAN pattern matching every :func:`stream_lease` key."""
    return f"{PREFIX}:stream-lease:*"
