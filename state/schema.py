"""The metadata store's tables, as SQLAlchemy Core objects.

This is the schema the code expects; migrations (``migrations/versions``) build it and an
integration test checks that the migrated database and these tables agree. Timestamps are
epoch milliseconds in BIGINT columns, so SQLite and PostgreSQL store them the same way.

Foreign keys restrict deletion: a project with topics, or a topic with subscriptions, cannot
lose its row, whatever the caller checked before. A subscription's replays go with it.
"""

from __future__ import annotations

import sqlalchemy as sa

NAME = sa.String(63)

metadata = sa.MetaData(
    naming_convention={
        "pk": "pk_%(table_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "uq": "uq_%(table_name)s_%(column_0_name)s",
        "ix": "ix_%(table_name)s_%(column_0_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
    }
)

projects = sa.Table(
    "projects",
    metadata,
    sa.Column("name", NAME, primary_key=True),
    sa.Column("description", sa.Text, nullable=False),
    sa.Column("created_at_ms", sa.BigInteger, nullable=False),
    # The produce quota (setu.model.ProduceQuota); NULL: the settings' default.
    sa.Column("quota_messages_per_second", sa.Float, nullable=True),
    sa.Column("quota_bytes_per_second", sa.Float, nullable=True),
)

topics = sa.Table(
    "topics",
    metadata,
    sa.Column(
        "project",
        NAME,
        sa.ForeignKey("projects.name", ondelete="RESTRICT"),
        primary_key=True,
    ),
    sa.Column("name", NAME, primary_key=True),
    sa.Column("grouped", sa.Boolean, nullable=False),
    sa.Column("partitions", sa.Integer, nullable=False),
    sa.Column("retention_hours", sa.Integer, nullable=False),
    sa.Column("dedup_window_seconds", sa.Integer, nullable=False, server_default="300"),
    # True between the start of a DELETE and the removal of the row (Kafka topics go first).
    sa.Column("deleting", sa.Boolean, nullable=False),
    sa.Column("created_at_ms", sa.BigInteger, nullable=False),
)

subscriptions = sa.Table(
    "subscriptions",
    metadata,
    sa.Column("project", NAME, primary_key=True),
    sa.Column("name", NAME, primary_key=True),
    sa.Column("topic", NAME, nullable=False),
    sa.Column("grouped", sa.Boolean, nullable=False),
    sa.Column("endpoint_url", sa.Text, nullable=False),
    sa.Column("endpoint_method", sa.String(8), nullable=False),
    # JSON list of [name, sealed value] pairs, in order (state.sealing).
    sa.Column("endpoint_headers", sa.JSON, nullable=False),
    sa.Column("endpoint_timeout_ms", sa.Integer, nullable=False),
    # The endpoint's TLS and OAuth2 settings as one sealed JSON object (state.sealing,
    # SubscriptionCodec); NULL when it has neither.
    sa.Column("endpoint_access", sa.Text, nullable=True),
    # The egress proxy it names (docs/security.md §4); NULL: the default one.
    sa.Column("endpoint_proxy", sa.String(64), nullable=True),
    sa.Column("retry_delays_ms", sa.JSON, nullable=False),
    # NULL means the default retryable codes.
    sa.Column("retryable_codes", sa.JSON, nullable=True),
    sa.Column("dead_letter_policy", sa.String(8), nullable=False),
    sa.Column("max_in_flight", sa.Integer, nullable=False),
    sa.Column("rate_limit_per_second", sa.Float, nullable=True),
    # The signing secrets as one sealed JSON list (state.sealing); NULL when there are none.
    sa.Column("signing_secrets", sa.Text, nullable=True),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("deleting", sa.Boolean, nullable=False),
    sa.Column("version", sa.Integer, nullable=False),
    sa.Column("seek_to_ms", sa.BigInteger, nullable=True),
    sa.Column("seek_generation", sa.Integer, nullable=False),
    sa.Column("created_at_ms", sa.BigInteger, nullable=False),
    sa.Column("updated_at_ms", sa.BigInteger, nullable=False),
    # setu.policies.Policies.json(); NULL: every policy at its default (docs/policies.md).
    sa.Column("policies", sa.JSON, nullable=True),
    # Why a policy paused the subscription; NULL otherwise.
    sa.Column("paused_reason", sa.Text, nullable=True),
    # The latest stop's mode and when it was asked for; NULL before any stop.
    sa.Column("stop_mode", sa.String(8), nullable=True),
    sa.Column("stop_requested_at_ms", sa.BigInteger, nullable=True),
    sa.ForeignKeyConstraint(
        ["project", "topic"],
        ["topics.project", "topics.name"],
        ondelete="RESTRICT",
        name="fk_subscriptions_topic_topics",
    ),
    sa.Index("ix_subscriptions_topic", "project", "topic"),
)

api_keys = sa.Table(
    "api_keys",
    metadata,
    sa.Column("key_id", sa.String(16), primary_key=True),
    sa.Column("name", sa.String(100), nullable=False),
    sa.Column("role", sa.String(16), nullable=False),
    # NULL only for admin keys (every project).
    sa.Column("project", NAME, nullable=True),
    # JSON list of topic names a producer key is limited to; NULL means every topic.
    sa.Column("topics", sa.JSON, nullable=True),
    # SHA-256 of the whole token, hex (setu.access).
    sa.Column("digest", sa.String(64), nullable=False),
    sa.Column("created_at_ms", sa.BigInteger, nullable=False),
    sa.Column("expires_at_ms", sa.BigInteger, nullable=True),
    sa.Column("last_used_at_ms", sa.BigInteger, nullable=True),
    sa.Column("revoked_at_ms", sa.BigInteger, nullable=True),
    sa.Index("ix_api_keys_project", "project"),
)


# Where a project's operational events go (docs/policies.md §4); one row per project at most.
notifications = sa.Table(
    "notifications",
    metadata,
    sa.Column("project", NAME, primary_key=True),
    sa.Column("url", sa.Text, nullable=False),
    # JSON list of event types.
    sa.Column("events", sa.JSON, nullable=False),
    # Sealed (state.sealing); NULL: calls are not signed.
    sa.Column("signing_secret", sa.Text, nullable=True),
    sa.Column("updated_at_ms", sa.BigInteger, nullable=False),
    sa.ForeignKeyConstraint(
        ["project"], ["projects.name"], ondelete="CASCADE", name="fk_notifications_project_projects"
    ),
)


# Replays (setu/replay.py, docs/replays.md): what was asked, and each partition's progress as
# its owner stores it.
replays = sa.Table(
    "replays",
    metadata,
    sa.Column("id", sa.String(40), primary_key=True),
    sa.Column("project", NAME, nullable=False),
    sa.Column("subscription", NAME, nullable=False),
    # setu.replay.Replay.spec_json()
    sa.Column("spec", sa.JSON, nullable=False),
    sa.Column("partitions", sa.Integer, nullable=False),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("created_at_ms", sa.BigInteger, nullable=False),
    sa.Column("ended_at_ms", sa.BigInteger, nullable=True),
    sa.ForeignKeyConstraint(
        ["project", "subscription"],
        ["subscriptions.project", "subscriptions.name"],
        ondelete="CASCADE",
        name="fk_replays_subscription_subscriptions",
    ),
    sa.Index("ix_replays_subscription", "project", "subscription"),
    sa.Index("ix_replays_state", "state"),
)

replay_partitions = sa.Table(
    "replay_partitions",
    metadata,
    sa.Column(
        "replay_id",
        sa.String(40),
        sa.ForeignKey("replays.id", ondelete="CASCADE"),
        primary_key=True,
    ),
    sa.Column("partition", sa.Integer, primary_key=True),
    # setu.replay.PartitionProgress.json()
    sa.Column("progress", sa.JSON, nullable=False),
    sa.Column("updated_at_ms", sa.BigInteger, nullable=False),
)

# Scheduled messages their producers cancelled (docs/scheduling.md): kept until the latest
# time a scheduled message can be due, then dropped.
schedule_cancels = sa.Table(
    "schedule_cancels",
    metadata,
    sa.Column("project", NAME, primary_key=True),
    sa.Column("topic", NAME, primary_key=True),
    sa.Column("message_id", sa.String(100), primary_key=True),
    sa.Column("cancelled_at_ms", sa.BigInteger, nullable=False),
    sa.Column("expires_at_ms", sa.BigInteger, nullable=False),
    sa.ForeignKeyConstraint(
        ["project", "topic"],
        ["topics.project", "topics.name"],
        ondelete="CASCADE",
        name="fk_schedule_cancels_topic_topics",
    ),
    sa.Index("ix_schedule_cancels_expires", "expires_at_ms"),
)
