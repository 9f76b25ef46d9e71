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
    """Sorted set of message ids delivered (2xx recorded) above the committed offset, by offset."""
    return f"{_sub(project, subscription)}:delivered:{partition}"


def counters(project: str, subscription: str) -> str:
    """Hash of lifetime counters: delivered_total, dead_lettered, retried."""
    return f"{_sub(project, subscription)}:counters"


def worker_stats(project: str, subscription: str) -> str:
    """Hash worker_id -> JSON of that worker's live figures (in_flight, retry_backlog, at)."""
    return f"{_sub(project, subscription)}:workers"


def producer_marks(project: str, topic: str) -> str:
    """Hash producer_id -> highest sequence id accepted into the main log (written by ingest)."""
    return f"{PREFIX}:producers:{{{project}.{topic}}}"


def worker_heartbeat(worker_id: str) -> str:
    """String with a TTL: present while the delivery worker is alive (for `--check` probes)."""
    return f"{PREFIX}:heartbeat:{worker_id}"
