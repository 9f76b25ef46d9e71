"""Tier numbers: where a message of a subscription sits.

Tier 0 is the topic's main log, tiers 1..N the subscription's retry topics ``rq.1..rq.N`` and
tier :data:`DLQ` its dead-letter topic. The DLQ number is fixed (one above the largest allowed
N) so stored group state keeps its meaning when a subscription changes its number of tiers.
"""

from __future__ import annotations

from setu import names
from setu.model import Subscription

MAIN = 0
DLQ = names.MAX_RETRY_TIERS + 1
# Where a group's head counts while its record stays in the main log (a message scheduled for
# later, docs/scheduling.md): the lowest retry tier, so the group's later messages park in
# retry tiers level with it or above, and the order rule of setu.ordering.groups holds.
HOLD = 1
ALL_TIERS = tuple(range(DLQ + 1))


def next_tier(tier: int, retry_tiers: int) -> int:
    """Where a message goes after failing in ``tier``: the next retry tier, else the DLQ."""
    return tier + 1 if tier < retry_tiers else DLQ


def after_failure(attempt: int, tier: int, retry_tiers: int) -> int:
    """Where a message waits after its own attempt number ``attempt`` failed (retryably) in
    ``tier``: every message keeps its own retry budget (docs/delivery.md, "Retry budget").

    It stays in ``tier`` while its attempts have not outgrown the tier (a message that waited
    behind its group in a high tier and became the head there); otherwise it moves one tier
    up. So it reaches the DLQ only after failing attempt N+1 in the last tier, wherever it
    waited before, and it never moves down (which would put it below newer messages of its
    group)."""
    if attempt <= tier:
        return tier
    return next_tier(tier, retry_tiers)


def is_retry(tier: int) -> bool:
    return MAIN < tier < DLQ


def tier_name(tier: int) -> str:
    """``main``, ``rq.3`` or ``dlq``: how operators and stored state name a tier."""
    if tier == MAIN:
        return "main"
    if tier == DLQ:
        return "dlq"
    return f"rq.{tier}"


def parse_tier_name(name: str) -> int:
    """Inverse of :func:`tier_name`; raises ValueError for anything else."""
    if name == "main":
        return MAIN
    if name == "dlq":
        return DLQ
    if name.startswith("rq.") and name[3:].isdigit() and 1 <= int(name[3:]) < DLQ:
        return int(name[3:])
    raise ValueError(f"not a tier name: {name!r}")


def topic_of(sub: Subscription, tier: int) -> str:
    """The Kafka topic of ``tier`` for ``sub``."""
    if tier == MAIN:
        return names.main_topic(sub.project, sub.topic)
    if tier == DLQ:
        return names.dlq_topic(sub.project, sub.name)
    return names.retry_topic(sub.project, sub.name, tier)


def topics_by_tier(sub: Subscription, retry_tiers: int | None = None) -> dict[str, int]:
    """Every Kafka topic ``sub`` consumes, mapped to its tier; ``retry_tiers``: how many it
    has in Kafka when that is not its own number (on a grouped topic, at least one:
    ``state.kafka_admin.held_tiers``)."""
    count = sub.retry.tiers if retry_tiers is None else retry_tiers
    tiers = [MAIN, *range(1, count + 1), DLQ]
    return {topic_of(sub, tier): tier for tier in tiers}
