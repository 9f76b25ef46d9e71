"""The librdkafka settings every producer of Setu's records shares: the one home of the rule.

- ``acks=all`` with idempotence: a record counts as written once every in-sync replica has it
  (``min.insync.replicas`` of Setu's topics makes that at least two on a cluster), and a retry
  by the client never writes it twice or out of order.
- The Java client's partitioner (``murmur2_random``): a key lands on the partition index the
  Java client would choose, so a group sits on the same index in every topic of its
  subscription (setu/partitioner.py checks it; docs/design.md §1).

The API's producer, delivery's producer of copies, the redrive command and the benchmarks
each add their own batching, timeout and size settings to these.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

PARTITIONER = "murmur2_random"


def durable_producer(
    bootstrap: str, client_config: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The shared settings, reaching ``bootstrap`` as ``client_config`` says (security,
    docs/security.md §8); the rule's own keys win over ``client_config``."""
    return {
        "bootstrap.servers": bootstrap,
        **(client_config or {}),
        "acks": "all",
        "enable.idempotence": True,
        "partitioner": PARTITIONER,
    }
