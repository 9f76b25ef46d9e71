"""Resource names and the Kafka names derived from them.

Names are lower-case letters, digits and inner hyphens (1..63 chars). No dots or underscores,
so derived Kafka names never collide: a topic's main log has three dot-separated parts, its
ingest topic four ending in ``ingest``, its group-state changelog four ending in ``groups``, a
subscription's DLQ four ending in ``dlq`` and its retry tiers five.
"""

from __future__ import annotations

import re

from setu.errors import InvalidInput

NAME_RE = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")
# The same rule as a whole-string pattern, for the OpenAPI document (and pydantic).
NAME_PATTERN = r"^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$"
PREFIX = "setu"
# Matches every ingest topic and nothing else (names cannot contain dots).
INGEST_PATTERN = r"setu\.[a-z0-9-]+\.[a-z0-9-]+\.ingest"
MAX_RETRY_TIERS = 9


def validate_name(kind: str, name: str) -> str:
    """Return ``name`` if it is a valid resource name, else raise InvalidInput."""
    # fullmatch: "$" would also match before a final newline ("shop\n" passed).
    if not is_name(name):
        raise InvalidInput(
            f"{kind} name {shown(name)} must be 1..63 lower-case letters, digits or inner hyphens"
        )
    return name


def is_name(text: str) -> bool:
    """Whether ``text`` can name a project, topic or subscription."""
    return len(text) <= 63 and NAME_RE.fullmatch(text) is not None


def shown(text: str, limit: int = 80) -> str:
    """``text`` quoted for an error message, cut at ``limit`` characters so that a huge input
    is not echoed back whole."""
    return repr(text) if len(text) <= limit else repr(text[:limit]) + f"... ({len(text)} chars)"


SHARED_INGEST_LOG = f"{PREFIX}.ingest"
"""The one ingest log of every topic when ``SETU_INGEST_LOG=shared`` (decision 0010): each
record names its topic in the ``setu-topic`` header. Two dot-separated parts, like the other
Kafka topics Setu keeps for itself, so no topic's Kafka name can be it."""
# What SETU_INGEST_LOG_TOPIC may name: the shared log, or another of its own (stacks and tests
# that share one broker).
SHARED_INGEST_LOG_PATTERN = r"^setu\.ingest(-[a-z0-9-]+)?$"


def with_shared_log(pattern: str, shared_log: str | None) -> str:
    """``pattern`` (a whole-name pattern, ``^...$``) that also matches ``shared_log``, if any:
    what the ingest job reads when records wait in both layouts."""
    if shared_log is None:
        return pattern
    return f"^(?:{pattern.removeprefix('^').removesuffix('$')}|{re.escape(shared_log)})$"


# An ingest topic is its main topic's name plus this.
INGEST_SUFFIX = ".ingest"


def ingest_topic(project: str, topic: str) -> str:
    return f"{main_topic(project, topic)}{INGEST_SUFFIX}"


def main_topic(project: str, topic: str) -> str:
    return f"{PREFIX}.{project}.{topic}"


def retry_topic(project: str, subscription: str, tier: int) -> str:
    if not 1 <= tier <= MAX_RETRY_TIERS:
        raise ValueError(f"retry tier {tier} outside 1..{MAX_RETRY_TIERS}")
    return f"{PREFIX}.{project}.{subscription}.rq.{tier}"


def dlq_topic(project: str, subscription: str) -> str:
    return f"{PREFIX}.{project}.{subscription}.dlq"


INGEST_QUERY_CHECKPOINT = "operator"
"""The ingest query's own folder inside ``SETU_SPARK_CHECKPOINT_DIR`` (spark/operator_job.py);
the checkpoint's top level is what the Python job of earlier versions left, taken over once."""


PRODUCER_MARKS_TOPIC = f"{PREFIX}.producer-marks"
"""The ingest job's compacted changelog of producer marks (spark/stream.py): key
``{ingest topic}/{partition}/{producer}``, value ``{incarnation}:{sequence}``. No Setu topic's
Kafka topic has two dots only."""


EVENTS_TOPIC = f"{PREFIX}.ops-events"
"""Every project's operational events, as the workers emit them (delivery/events.py,
docs/policies.md §4). Two dots only: no Setu topic's Kafka topic is named so."""

EVENTS_RETRY_TOPIC = f"{PREFIX}.ops-events-retry"
"""Operational events whose call failed, each with when to call again."""

EVENTS_PARTITIONS = 3
"""Partitions of both events topics: up to three workers' notifiers share the sending."""

NOTIFIER_GROUP = f"{PREFIX}.notifier"
"""The consumer group of every worker's notifier on the two events topics."""


def state_topic(project: str, subscription: str) -> str:
    """The subscription's own group-state changelog of the earlier layout (compacted;
    state/changelog.py): copied when a partition is first claimed under the shared changelog
    (decision 0014), and deleted with the subscription."""
    return f"{PREFIX}.{project}.{subscription}.state"


def groups_topic(project: str, topic: str) -> str:
    """The group-state changelog of every subscription of a topic (compacted; made and
    deleted with the topic; state/shared_changelog.py). Four parts ending in ``groups``, which
    no subscription's topic ends in."""
    return f"{PREFIX}.{project}.{topic}.groups"


def consumer_group(project: str, subscription: str) -> str:
    return f"{PREFIX}.sub.{project}.{subscription}"


def subscription_topics(project: str, subscription: str, tiers: int) -> list[str]:
    """The topics a subscription owns: its retry tiers in order, then its DLQ."""
    return [retry_topic(project, subscription, n) for n in range(1, tiers + 1)] + [
        dlq_topic(project, subscription)
    ]


# A topic's ingest reject topic is its main topic's name with this suffix.
INGEST_REJECTS_SUFFIX = ".ingest.rejects"


def ingest_rejects_topic(project: str, topic: str) -> str:
    """Where the ingest job sets aside records it cannot write to the main log."""
    return f"{main_topic(project, topic)}{INGEST_REJECTS_SUFFIX}"


def parse_main_topic(kafka_topic: str) -> tuple[str, str]:
    """Return (project, topic) of a main topic name, else raise ValueError."""
    parts = kafka_topic.split(".")
    if len(parts) != 3 or parts[0] != PREFIX:
        raise ValueError(f"not a main topic: {kafka_topic!r}")
    return parts[1], parts[2]


def parse_ingest_topic(kafka_topic: str) -> tuple[str, str]:
    """Return (project, topic) of an ingest topic name, else raise ValueError."""
    parts = kafka_topic.split(".")
    if len(parts) != 4 or parts[0] != PREFIX or parts[3] != "ingest":
        raise ValueError(f"not an ingest topic: {kafka_topic!r}")
    return parts[1], parts[2]
