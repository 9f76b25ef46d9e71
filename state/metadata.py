"""The metadata store: projects, topics and subscriptions in SQL (SQLite or PostgreSQL); API
keys have their own part (:mod:`state.api_keys`), on the same database.

Contract:

- Synchronous SQLAlchemy 2 Core. Every method is one short transaction and may be called from
  many threads at once; code on an event loop runs the methods in a worker thread.
- Returns the frozen dataclasses of :mod:`setu.model`. Raises :class:`~setu.errors.NotFound`,
  :class:`~setu.errors.Conflict`, and :class:`~setu.errors.DependencyUnavailable` when the
  database does not answer.
- Creates are idempotent: ``create_*`` returns ``(record, created)``; ``created`` is False when
  an equal record already existed, and a different one raises Conflict. ``preflight_*`` answers
  the same question without writing, so a caller can decide before creating Kafka topics.
- Deleting a topic or subscription takes two steps around the removal of its Kafka topics:
  ``mark_*_deleting`` (from then on get, find and list no longer show it, and delivery workers
  that poll :meth:`list_subscriptions` stop it), then ``delete_*`` removes the row. A crash in
  between leaves a marked row that a repeated DELETE finishes.
- Only :meth:`update_subscription` bumps a subscription's ``version``; lifecycle actions and
  seeks change their own columns, so they never invalidate an operator's pending PUT.
"""

from __future__ import annotations

import dataclasses
import json
from contextlib import AbstractContextManager
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Row
from sqlalchemy.exc import IntegrityError

from setu.clock import now_ms
from setu.errors import Conflict, NotFound
from setu.model import (
    DeadLetterPolicy,
    Endpoint,
    EndpointTls,
    Notifications,
    OAuth2Credentials,
    ProduceQuota,
    Project,
    RetryPolicy,
    SigningSecret,
    StopMode,
    Subscription,
    SubscriptionState,
    Topic,
    rotate_secrets,
)
from setu.policies import Policies
from state.api_keys import KeyStore, revoke_project_keys
from state.lifecycle import LifecycleAction, next_state
from state.replays import ReplayStore
from state.schedule_cancels import ScheduleCancels
from state.schema import notifications, projects, subscriptions, topics
from state.sealing import Sealer
from state.sql import make_engine, transaction


def _project(row: Row[Any]) -> Project:
    return Project(
        name=row.name,
        description=row.description,
        created_at_ms=row.created_at_ms,
        quota=ProduceQuota(row.quota_messages_per_second, row.quota_bytes_per_second),
    )


def _project_values(project: Project) -> dict[str, Any]:
    return {
        "name": project.name,
        "description": project.description,
        "created_at_ms": project.created_at_ms,
        "quota_messages_per_second": project.quota.messages_per_second,
        "quota_bytes_per_second": project.quota.bytes_per_second,
    }


def _topic(row: Row[Any]) -> Topic:
    return Topic(
        project=row.project,
        name=row.name,
        grouped=row.grouped,
        partitions=row.partitions,
        retention_hours=row.retention_hours,
        created_at_ms=row.created_at_ms,
        dedup_window_seconds=row.dedup_window_seconds,
    )


class SubscriptionCodec:
    """Rows to subscriptions and back, sealing the secrets (docs/security.md §5): each endpoint
    header value on its own, and the signing secrets as one sealed JSON list."""

    def __init__(self, sealer: Sealer) -> None:
        self._sealer = sealer

    @property
    def sealer(self) -> Sealer:
        return self._sealer

    def read(self, row: Row[Any]) -> Subscription:
        codes = row.retryable_codes
        return Subscription(
            project=row.project,
            name=row.name,
            topic=row.topic,
            grouped=row.grouped,
            endpoint=Endpoint(
                url=row.endpoint_url,
                method=row.endpoint_method,
                headers=tuple((str(k), self._sealer.open(str(v))) for k, v in row.endpoint_headers),
                timeout_ms=row.endpoint_timeout_ms,
                proxy=row.endpoint_proxy,
                **self.open_access(row.endpoint_access),
            ),
            retry=RetryPolicy(
                delays_ms=tuple(int(d) for d in row.retry_delays_ms),
                retryable_codes=None if codes is None else tuple(int(c) for c in codes),
            ),
            dead_letter_policy=DeadLetterPolicy(row.dead_letter_policy),
            max_in_flight=row.max_in_flight,
            rate_limit_per_second=row.rate_limit_per_second,
            signing_secrets=self.open_secrets(row.signing_secrets),
            state=SubscriptionState(row.state),
            version=row.version,
            seek_to_ms=row.seek_to_ms,
            seek_generation=row.seek_generation,
            created_at_ms=row.created_at_ms,
            policies=Policies.from_json(row.policies),
            paused_reason=row.paused_reason,
            stop_mode=StopMode(row.stop_mode or StopMode.GRACEFUL.value),
            stop_requested_at_ms=row.stop_requested_at_ms,
        )

    def config(self, sub: Subscription) -> dict[str, Any]:
        """The columns a PUT may change."""
        return {
            "grouped": sub.grouped,
            "endpoint_url": sub.endpoint.url,
            "endpoint_method": sub.endpoint.method,
            "endpoint_headers": [[k, self._sealer.seal(v)] for k, v in sub.endpoint.headers],
            "endpoint_timeout_ms": sub.endpoint.timeout_ms,
            "endpoint_access": self.seal_access(sub.endpoint),
            "endpoint_proxy": sub.endpoint.proxy,
            "retry_delays_ms": list(sub.retry.delays_ms),
            "retryable_codes": (
                None if sub.retry.retryable_codes is None else list(sub.retry.retryable_codes)
            ),
            "dead_letter_policy": sub.dead_letter_policy.value,
            "max_in_flight": sub.max_in_flight,
            "rate_limit_per_second": sub.rate_limit_per_second,
            "signing_secrets": self.seal_secrets(sub.signing_secrets),
            "policies": sub.policies.json(),
        }

    def resealed(self, row: Row[Any]) -> dict[str, Any]:
        """The secret columns of ``row`` sealed again under the first key."""
        reseal = self._sealer.reseal
        sealed = row.signing_secrets
        access = row.endpoint_access
        return {
            "endpoint_headers": [[k, reseal(str(v))] for k, v in row.endpoint_headers],
            "signing_secrets": None if sealed is None else reseal(sealed),
            "endpoint_access": None if access is None else reseal(access),
        }

    def seal_access(self, endpoint: Endpoint) -> str | None:
        """The endpoint's TLS and OAuth2 settings, sealed as one JSON object."""
        if endpoint.tls is None and endpoint.oauth2 is None:
            return None
        held = {
            "tls": None if endpoint.tls is None else dataclasses.asdict(endpoint.tls),
            "oauth2": None if endpoint.oauth2 is None else dataclasses.asdict(endpoint.oauth2),
        }
        return self._sealer.seal(json.dumps(held))

    def open_access(self, sealed: str | None) -> dict[str, Any]:
        """``tls`` and ``oauth2`` of an Endpoint, from what :meth:`seal_access` made."""
        if sealed is None:
            return {}
        held = json.loads(self._sealer.open(sealed))
        oauth2 = held.get("oauth2")
        if oauth2 is not None:
            oauth2 = OAuth2Credentials(**{**oauth2, "scopes": tuple(oauth2.get("scopes", ()))})
        tls = held.get("tls")
        return {"tls": None if tls is None else EndpointTls(**tls), "oauth2": oauth2}

    def seal_secrets(self, held: tuple[SigningSecret, ...]) -> str | None:
        if not held:
            return None
        return self._sealer.seal(json.dumps([dataclasses.asdict(s) for s in held]))

    def open_secrets(self, sealed: str | None) -> tuple[SigningSecret, ...]:
        if sealed is None:
            return ()
        return tuple(SigningSecret(**item) for item in json.loads(self._sealer.open(sealed)))


def same_topic(a: Topic, b: Topic) -> bool:
    """Whether two topics have the same identity and spec (creation time aside)."""
    return dataclasses.replace(a, created_at_ms=0) == dataclasses.replace(b, created_at_ms=0)


def same_subscription(a: Subscription, b: Subscription) -> bool:
    """Whether two subscriptions have the same identity and configuration (run state aside)."""

    def config(s: Subscription) -> Subscription:
        return dataclasses.replace(
            s,
            # The same secrets, whatever ids and times they were given.
            signing_secrets=tuple(SigningSecret("", secret.value) for secret in s.signing_secrets),
            state=SubscriptionState.RUNNING,
            version=1,
            seek_to_ms=None,
            seek_generation=0,
            created_at_ms=0,
            paused_reason=None,
            stop_mode=StopMode.GRACEFUL,
            stop_requested_at_ms=None,
        )

    return config(a) == config(b)


class MetadataStore:
    """Projects, topics and subscriptions, persisted in the database at ``url``."""

    def __init__(self, url: str, sealer: Sealer) -> None:
        self._engine = make_engine(url)
        self._codec = SubscriptionCodec(sealer)
        self.keys = KeyStore(self._engine)
        self.replays = ReplayStore(self._engine)
        self.schedule_cancels = ScheduleCancels(self._engine)
        # The subscriptions of the last full listing as read, each beside its row: a row found
        # unchanged is not decoded again (its secrets opened, its policies parsed). A delivery
        # worker lists every subscription every 30 s as a backstop; at 1,000 that decoding
        # was most of an idle worker's listing.
        self._listed: dict[tuple[str, str], tuple[tuple[Any, ...], Subscription]] = {}

    def close(self) -> None:
        self._engine.dispose()

    def _tx(self, *, write: bool = False) -> AbstractContextManager[Connection]:
        return transaction(self._engine, write=write)

    def ping(self) -> None:
        """Raises DependencyUnavailable unless the database answers ``SELECT 1``."""
        with self._tx() as conn:
            conn.execute(sa.text("SELECT 1"))

    # Projects

    def create_project(self, project: Project) -> tuple[Project, bool]:
        try:
            with self._tx(write=True) as conn:
                existing = self._project_row(conn, project.name)
                if existing is None:
                    values = dataclasses.replace(project, created_at_ms=now_ms())
                    conn.execute(sa.insert(projects).values(_project_values(values)))
                    return values, True
        except IntegrityError:
            pass  # created concurrently: compare with the winner below
        stored = self.get_project(project.name)
        if (stored.description, stored.quota) != (project.description, project.quota):
            raise Conflict(f"project {project.name!r} exists with a different configuration")
        return stored, False

    def set_project_quota(self, name: str, quota: ProduceQuota) -> Project:
        """Replaces the project's produce quota."""
        with self._tx(write=True) as conn:
            updated = conn.execute(
                sa.update(projects)
                .where(projects.c.name == name)
                .values(
                    quota_messages_per_second=quota.messages_per_second,
                    quota_bytes_per_second=quota.bytes_per_second,
                )
            )
            if updated.rowcount == 0:
                raise NotFound(f"project {name!r} not found")
            found = self._project_row(conn, name)
        assert found is not None
        return found

    def get_project(self, name: str) -> Project:
        with self._tx() as conn:
            row = self._project_row(conn, name)
        if row is None:
            raise NotFound(f"project {name!r} not found")
        return row

    def find_project(self, name: str) -> Project | None:
        with self._tx() as conn:
            return self._project_row(conn, name)

    def list_projects(self) -> list[Project]:
        with self._tx() as conn:
            rows = conn.execute(sa.select(projects).order_by(projects.c.name)).all()
        return [_project(r) for r in rows]

    def delete_project(self, name: str) -> None:
        """Deletes an empty project; Conflict while it has topics or subscriptions."""
        with self._tx(write=True) as conn:
            if self._project_row(conn, name) is None:
                raise NotFound(f"project {name!r} not found")
            count = conn.execute(
                sa.select(sa.func.count()).select_from(topics).where(topics.c.project == name)
            ).scalar_one()
            if count:
                raise Conflict(f"project {name!r} still has {count} topic(s); delete them first")
            conn.execute(sa.delete(notifications).where(notifications.c.project == name))
            conn.execute(sa.delete(projects).where(projects.c.name == name))
            revoke_project_keys(conn, name)

    # Where a project's operational events go (docs/policies.md §4)

    def set_notifications(self, n: Notifications) -> Notifications:
        """Creates or replaces the project's notification endpoint (NotFound: no project)."""
        values = {
            "url": n.url,
            "events": list(n.events),
            "signing_secret": (
                None if n.signing_secret is None else self._codec.sealer.seal(n.signing_secret)
            ),
            "updated_at_ms": now_ms(),
        }
        with self._tx(write=True) as conn:
            if self._project_row(conn, n.project) is None:
                raise NotFound(f"project {n.project!r} not found")
            done = conn.execute(
                sa.update(notifications)
                .where(notifications.c.project == n.project)
                .values(**values)
            )
            if done.rowcount == 0:
                conn.execute(sa.insert(notifications).values(project=n.project, **values))
        return self.get_notifications(n.project)

    def get_notifications(self, project: str) -> Notifications:
        """The project's notification endpoint; NotFound when it has none."""
        with self._tx() as conn:
            row = conn.execute(
                sa.select(notifications).where(notifications.c.project == project)
            ).one_or_none()
        if row is None:
            raise NotFound(f"project {project!r} has no notification endpoint")
        return self._notifications(row)

    def list_notifications(self) -> list[Notifications]:
        with self._tx() as conn:
            rows = conn.execute(sa.select(notifications)).all()
        return [self._notifications(row) for row in rows]

    def delete_notifications(self, project: str) -> None:
        """Removes the project's notification endpoint; NotFound when it has none."""
        with self._tx(write=True) as conn:
            done = conn.execute(sa.delete(notifications).where(notifications.c.project == project))
        if done.rowcount == 0:
            raise NotFound(f"project {project!r} has no notification endpoint")

    def _notifications(self, row: Row[Any]) -> Notifications:
        sealed = row.signing_secret
        return Notifications(
            project=row.project,
            url=row.url,
            events=tuple(str(e) for e in row.events),
            signing_secret=None if sealed is None else self._codec.sealer.open(sealed),
            updated_at_ms=row.updated_at_ms,
        )

    # Topics

    def preflight_topic(self, topic: Topic) -> Topic | None:
        """The stored topic equal to ``topic``, or None if none has its name. Raises NotFound
        for an unknown project, Conflict for a different topic or one being deleted."""
        with self._tx() as conn:
            return self._equal_topic(conn, topic)

    def create_topic(self, topic: Topic) -> tuple[Topic, bool]:
        try:
            with self._tx(write=True) as conn:
                existing = self._equal_topic(conn, topic)
                if existing is not None:
                    return existing, False
                values = dataclasses.replace(topic, created_at_ms=now_ms())
                conn.execute(sa.insert(topics).values(**dataclasses.asdict(values), deleting=False))
                return values, True
        except IntegrityError:
            pass
        with self._tx() as conn:
            existing = self._equal_topic(conn, topic)
        if existing is None:
            raise Conflict(f"topic {topic.name!r} changed while it was being created; retry")
        return existing, False

    def get_topic(self, project: str, name: str) -> Topic:
        found = self.find_topic(project, name)
        if found is None:
            raise NotFound(f"topic {name!r} not found in project {project!r}")
        return found

    def find_topic(self, project: str, name: str) -> Topic | None:
        with self._tx() as conn:
            row = self._topic_row(conn, project, name)
        return None if row is None or row.deleting else _topic(row)

    def list_topics(self, project: str) -> list[Topic]:
        with self._tx() as conn:
            if self._project_row(conn, project) is None:
                raise NotFound(f"project {project!r} not found")
            rows = conn.execute(
                sa.select(topics)
                .where(topics.c.project == project, topics.c.deleting.is_(False))
                .order_by(topics.c.name)
            ).all()
        return [_topic(r) for r in rows]

    def mark_topic_deleting(self, project: str, name: str) -> Topic:
        """Hides the topic until :meth:`delete_topic`; Conflict while subscriptions exist."""
        with self._tx(write=True) as conn:
            row = self._topic_row(conn, project, name, lock=True)
            if row is None:
                raise NotFound(f"topic {name!r} not found in project {project!r}")
            count = conn.execute(
                sa.select(sa.func.count())
                .select_from(subscriptions)
                .where(subscriptions.c.project == project, subscriptions.c.topic == name)
            ).scalar_one()
            if count:
                raise Conflict(f"topic {name!r} still has {count} subscription(s)")
            conn.execute(
                sa.update(topics)
                .where(topics.c.project == project, topics.c.name == name)
                .values(deleting=True)
            )
            return _topic(row)

    def delete_topic(self, project: str, name: str) -> None:
        """Removes a topic marked deleting; does nothing to an unmarked or unknown one."""
        with self._tx(write=True) as conn:
            conn.execute(
                sa.delete(topics).where(
                    topics.c.project == project, topics.c.name == name, topics.c.deleting
                )
            )

    # Subscriptions

    def preflight_subscription(self, sub: Subscription) -> Subscription | None:
        """As :meth:`preflight_topic`, for a subscription (and its topic)."""
        with self._tx() as conn:
            return self._equal_subscription(conn, sub)

    def create_subscription(self, sub: Subscription) -> tuple[Subscription, bool]:
        try:
            with self._tx(write=True) as conn:
                existing = self._equal_subscription(conn, sub, lock_topic=True)
                if existing is not None:
                    return existing, False
                at = now_ms()
                conn.execute(
                    sa.insert(subscriptions).values(
                        project=sub.project,
                        name=sub.name,
                        topic=sub.topic,
                        **self._codec.config(sub),
                        state=sub.state.value,
                        deleting=False,
                        version=1,
                        # Where it starts is a seek its first takeover applies.
                        seek_to_ms=sub.policies.start_from.seek_to_ms(at),
                        seek_generation=int(sub.policies.start_from.kind != "earliest"),
                        created_at_ms=at,
                        updated_at_ms=at,
                    )
                )
                return self._require_subscription(conn, sub.project, sub.name), True
        except IntegrityError:
            pass
        with self._tx() as conn:
            existing = self._equal_subscription(conn, sub)
        if existing is None:
            raise Conflict(f"subscription {sub.name!r} changed while it was being created")
        return existing, False

    def get_subscription(self, project: str, name: str) -> Subscription:
        with self._tx() as conn:
            return self._require_subscription(conn, project, name)

    def list_subscriptions(self, project: str | None = None) -> list[Subscription]:
        """Subscriptions of one project (NotFound if unknown), or of all projects when None."""
        query = sa.select(subscriptions).where(subscriptions.c.deleting.is_(False))
        with self._tx() as conn:
            if project is not None:
                if self._project_row(conn, project) is None:
                    raise NotFound(f"project {project!r} not found")
                query = query.where(subscriptions.c.project == project)
            rows = conn.execute(query.order_by(subscriptions.c.project, subscriptions.c.name)).all()
        if project is not None:
            return [self._codec.read(r) for r in rows]
        listed, known = {}, self._listed
        for row in rows:
            key, raw = (row.project, row.name), tuple(row)
            seen = known.get(key)
            listed[key] = (
                seen if seen is not None and seen[0] == raw else (raw, self._codec.read(row))
            )
        self._listed = listed
        return [sub for _, sub in listed.values()]

    def update_subscription(self, sub: Subscription, expected_version: int) -> Subscription:
        """Replaces the configuration; Conflict unless the stored version is ``expected``."""
        with self._tx(write=True) as conn:
            current = self._require_subscription(conn, sub.project, sub.name, lock=True)
            if current.version != expected_version:
                raise Conflict(
                    f"subscription {sub.name!r} is at version {current.version}, "
                    f"not {expected_version}; read it again and retry"
                )
            self._update(
                conn,
                sub.project,
                sub.name,
                **self._codec.config(sub),
                version=subscriptions.c.version + 1,
            )
            return self._require_subscription(conn, sub.project, sub.name)

    def rotate_signing_secret(
        self, project: str, name: str, new: SigningSecret, previous_until_ms: int
    ) -> Subscription:
        """Makes ``new`` the current signing secret; the current one stays valid until
        ``previous_until_ms`` (setu.model.rotate_secrets). Leaves ``version`` alone."""
        with self._tx(write=True) as conn:
            current = self._require_subscription(conn, project, name, lock=True)
            held = rotate_secrets(current.signing_secrets, new, previous_until_ms)
            self._update(conn, project, name, signing_secrets=self._codec.seal_secrets(held))
            return self._require_subscription(conn, project, name)

    def remove_signing_secret(self, project: str, name: str, secret_id: str) -> Subscription:
        """Drops one signing secret (ending a rotation early); NotFound if it is not held."""
        with self._tx(write=True) as conn:
            current = self._require_subscription(conn, project, name, lock=True)
            held = tuple(s for s in current.signing_secrets if s.id != secret_id)
            if len(held) == len(current.signing_secrets):
                raise NotFound(f"subscription {name!r} holds no signing secret {secret_id!r}")
            self._update(conn, project, name, signing_secrets=self._codec.seal_secrets(held))
            return self._require_subscription(conn, project, name)

    def reseal_secrets(self) -> int:
        """Seals every stored secret again under the first key (``setu secrets rotate``);
        returns how many rows (subscriptions, notification endpoints) were rewritten. Each row
        is its own transaction."""
        with self._tx() as conn:
            keys = conn.execute(sa.select(subscriptions.c.project, subscriptions.c.name)).all()
            signed = (
                conn.execute(
                    sa.select(notifications.c.project).where(
                        notifications.c.signing_secret.is_not(None)
                    )
                )
                .scalars()
                .all()
            )
        for project in signed:
            with self._tx(write=True) as conn:
                sealed = conn.execute(
                    sa.select(notifications.c.signing_secret)
                    .where(notifications.c.project == project)
                    .with_for_update()
                ).scalar_one_or_none()
                if sealed is not None:
                    conn.execute(
                        sa.update(notifications)
                        .where(notifications.c.project == project)
                        .values(signing_secret=self._codec.sealer.reseal(sealed))
                    )
        for project, name in keys:
            with self._tx(write=True) as conn:
                row = self._subscription_row(conn, project, name, lock=True)
                if row is not None:
                    conn.execute(
                        sa.update(subscriptions)
                        .where(subscriptions.c.project == project, subscriptions.c.name == name)
                        .values(**self._codec.resealed(row))
                    )
        return len(keys) + len(signed)

    def apply_lifecycle(self, project: str, name: str, action: LifecycleAction) -> Subscription:
        """Moves the subscription's state by ``action`` (see :mod:`state.lifecycle`)."""
        with self._tx(write=True) as conn:
            current = self._require_subscription(conn, project, name, lock=True)
            state = next_state(current.state, action)
            # Whatever an operator does next, a policy's pause reason no longer holds.
            if state != current.state or current.paused_reason is not None:
                self._update(conn, project, name, state=state.value, paused_reason=None)
            return dataclasses.replace(current, state=state, paused_reason=None)

    def request_stop(self, project: str, name: str, mode: StopMode) -> Subscription:
        """Stops the subscription (from any state) and records how and when it was asked."""
        with self._tx(write=True) as conn:
            self._require_subscription(conn, project, name, lock=True)
            self._update(
                conn,
                project,
                name,
                state=SubscriptionState.STOPPED.value,
                paused_reason=None,
                stop_mode=mode.value,
                stop_requested_at_ms=now_ms(),
            )
            return self._require_subscription(conn, project, name)

    def pause_by_policy(self, project: str, name: str, reason: str) -> Subscription | None:
        """Pauses a running subscription with ``reason`` (docs/policies.md §3); None when it
        is not running (an operator stopped or paused it meanwhile: nothing to do)."""
        with self._tx(write=True) as conn:
            current = self._subscription_row(conn, project, name, lock=True)
            if current is None or current.state != SubscriptionState.RUNNING.value:
                return None
            self._update(
                conn, project, name, state=SubscriptionState.PAUSED.value, paused_reason=reason
            )
            return self._require_subscription(conn, project, name)

    def request_seek(self, project: str, name: str, timestamp_ms: int) -> Subscription:
        """Asks workers to reset the main offset to ``timestamp_ms``; the subscription must be
        stopped (Conflict otherwise). Bumps ``seek_generation`` so workers notice."""
        with self._tx(write=True) as conn:
            current = self._require_subscription(conn, project, name, lock=True)
            if current.state != SubscriptionState.STOPPED:
                raise Conflict(f"stop subscription {name!r} before seeking it")
            self._update(
                conn,
                project,
                name,
                seek_to_ms=timestamp_ms,
                seek_generation=subscriptions.c.seek_generation + 1,
            )
            return self._require_subscription(conn, project, name)

    def mark_subscription_deleting(self, project: str, name: str) -> Subscription:
        """Hides the subscription until :meth:`delete_subscription`. Idempotent; NotFound only
        when no row is left at all."""
        with self._tx(write=True) as conn:
            row = self._subscription_row(conn, project, name, lock=True)
            if row is None:
                raise NotFound(f"subscription {name!r} not found in project {project!r}")
            if not row.deleting:
                self._update(conn, project, name, deleting=True)
            return self._codec.read(row)

    def delete_subscription(self, project: str, name: str) -> None:
        """Removes a subscription marked deleting; does nothing otherwise."""
        with self._tx(write=True) as conn:
            conn.execute(
                sa.delete(subscriptions).where(
                    subscriptions.c.project == project,
                    subscriptions.c.name == name,
                    subscriptions.c.deleting,
                )
            )

    # Row access inside a transaction

    @staticmethod
    def _project_row(conn: Connection, name: str) -> Project | None:
        row = conn.execute(sa.select(projects).where(projects.c.name == name)).first()
        return None if row is None else _project(row)

    @staticmethod
    def _topic_row(
        conn: Connection, project: str, name: str, lock: bool = False
    ) -> Row[Any] | None:
        query = sa.select(topics).where(topics.c.project == project, topics.c.name == name)
        return conn.execute(query.with_for_update() if lock else query).first()

    @staticmethod
    def _subscription_row(
        conn: Connection, project: str, name: str, lock: bool = False
    ) -> Row[Any] | None:
        query = sa.select(subscriptions).where(
            subscriptions.c.project == project, subscriptions.c.name == name
        )
        return conn.execute(query.with_for_update() if lock else query).first()

    def _require_subscription(
        self, conn: Connection, project: str, name: str, lock: bool = False
    ) -> Subscription:
        row = self._subscription_row(conn, project, name, lock)
        if row is None or row.deleting:
            raise NotFound(f"subscription {name!r} not found in project {project!r}")
        return self._codec.read(row)

    @staticmethod
    def _update(conn: Connection, project: str, name: str, **values: Any) -> None:
        conn.execute(
            sa.update(subscriptions)
            .where(subscriptions.c.project == project, subscriptions.c.name == name)
            .values(**values, updated_at_ms=now_ms())
        )

    def _equal_topic(self, conn: Connection, topic: Topic) -> Topic | None:
        if self._project_row(conn, topic.project) is None:
            raise NotFound(f"project {topic.project!r} not found")
        row = self._topic_row(conn, topic.project, topic.name)
        if row is None:
            return None
        if row.deleting:
            raise Conflict(f"topic {topic.name!r} is being deleted; repeat the DELETE first")
        stored = _topic(row)
        if not same_topic(stored, topic):
            raise Conflict(f"topic {topic.name!r} exists with a different configuration")
        return stored

    def _equal_subscription(
        self, conn: Connection, sub: Subscription, lock_topic: bool = False
    ) -> Subscription | None:
        if self._project_row(conn, sub.project) is None:
            raise NotFound(f"project {sub.project!r} not found")
        # Locking the topic row orders this insert against a concurrent topic deletion.
        topic_row = self._topic_row(conn, sub.project, sub.topic, lock=lock_topic)
        if topic_row is None or topic_row.deleting:
            raise NotFound(f"topic {sub.topic!r} not found in project {sub.project!r}")
        row = self._subscription_row(conn, sub.project, sub.name)
        if row is None:
            return None
        if row.deleting:
            raise Conflict(f"subscription {sub.name!r} is being deleted; repeat the DELETE first")
        stored = self._codec.read(row)
        if not same_subscription(stored, sub):
            raise Conflict(f"subscription {sub.name!r} exists with a different configuration")
        return stored
