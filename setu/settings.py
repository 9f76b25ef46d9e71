"""All configuration, read once from ``SETU_*`` environment variables.

Only the composition root (``cli``) builds a :class:`Settings`; everything else receives the
values it needs as arguments.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from setu.egress import Egress
from setu.kafka_security import KafkaSecurity, SaslMechanism, SecurityProtocol
from setu.limits import DEFAULT_HTTP_HEAD_TIMEOUT_MS, DEFAULT_MAX_MESSAGE_BYTES
from setu.names import SHARED_INGEST_LOG, SHARED_INGEST_LOG_PATTERN

MIB = 1024 * 1024
# One producer's burst of highly compressible bytes once stopped ingest for every project; at
# this rate it is admitted as fast as the job carries it (docs/security.md §6).
DEFAULT_PRODUCE_BYTES_PER_SECOND = 8 * MIB


class Settings(BaseSettings):
    """Every knob of every process. Defaults suit one small machine (``setu dev up``)."""

    # Errors never echo their input: it may hold a password (docs/security.md §8).
    model_config = SettingsConfigDict(env_prefix="SETU_", extra="ignore", hide_input_in_errors=True)

    # Where everything local lives: SQLite file, Kafka and Redis data, logs, Spark checkpoints.
    data_dir: Path = Path(".setu")
    # Downloaded jars (Kafka broker, Spark's Kafka connector); shared across data dirs.
    cache_dir: Path = Field(default_factory=lambda: Path.home() / ".cache" / "setu")
    log_level: str = "INFO"

    # Dependencies. Unset Kafka or Redis means `setu dev up` starts its own.
    kafka_bootstrap: str | None = None
    redis_url: str | None = None
    # Redis behind Sentinel: "host:port,host:port,..." of the Sentinels, which name the
    # primary of SETU_REDIS_SENTINEL_MASTER (found again after a failover); SETU_REDIS_URL
    # then gives only the database, password and TLS of the connections to it.
    redis_sentinels: str | None = None
    redis_sentinel_master: str = "setu"
    redis_sentinel_password: SecretStr | None = None
    # Connections one process's asyncio client opens at most; commands beyond wait for one.
    redis_max_connections: int = Field(default=100, ge=1)
    database_url: str | None = None

    # API
    api_host: str = "127.0.0.1"
    api_port: int = 8080
    # One log line per request costs about as much CPU as a produce; Prometheus counts them.
    api_access_log: bool = False
    # The largest produce body; every other size limit follows from it (setu.limits).
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    max_batch_messages: int = 10_000
    # Whole batch-produce request body (JSON), refused with 413 above it.
    max_batch_bytes: int = 32 * MIB
    produce_timeout_ms: int = 10_000
    # The furthest ahead a message may be scheduled (X_DELIVER_AT, docs/scheduling.md); a
    # topic's own retention, less an hour, bounds it further.
    max_delivery_delay_ms: int = Field(default=7 * 86_400_000, ge=1_000)
    # How long a request's line and headers may take to arrive once its first byte (or the
    # connection) came: the connection is closed past it (api/server.py, docs/limits.md).
    http_head_timeout_ms: int = Field(default=DEFAULT_HTTP_HEAD_TIMEOUT_MS, ge=100)
    allow_private_endpoints: bool = False
    # Egress proxies (docs/security.md §4): every webhook call is tunnelled through
    # SETU_EGRESS_PROXY (http://[user:password@]host[:port]) unless its subscription names one
    # of SETU_EGRESS_PROXIES (a JSON object of name to URL). Secrets: their URLs may carry
    # credentials.
    egress_proxy: SecretStr | None = None
    egress_proxies: dict[str, SecretStr] = Field(default_factory=dict)
    # Security (docs/security.md). The bootstrap admin key, accepted besides stored keys.
    admin_key: SecretStr | None = None
    # Fernet key(s) sealing secrets at rest, comma-separated, the first one sealing
    # (docs/security.md §5). Required by the API, delivery workers and `setu migrate` once
    # secrets are stored; `setu dev up` makes one.
    secret_key: SecretStr | None = None
    # False answers every request as an admin would: only for benchmarks and experiments on a
    # machine of one's own (the API logs a warning at every start).
    auth_enabled: bool = True
    # Produce quota of a project that sets none of its own, over all API replicas
    # (docs/security.md §6). Messages: unset, no limit. Bytes: 8 MiB/s unless set, a rate one
    # ingest job carries beside every other project's traffic (bench/burst.py); 0: no limit.
    produce_quota_messages_per_second: float | None = Field(default=None, ge=0.01)
    produce_quota_bytes_per_second: float = Field(default=DEFAULT_PRODUCE_BYTES_PER_SECOND, ge=0)

    # Streaming produce (docs/streaming.md): a TCP listener served by `setu api` beside HTTP.
    # Unset: no listener. `setu dev up` and the chart set it.
    stream_port: int | None = Field(default=None, ge=0, le=65535)
    # Credits a session starts with: how many MESSAGE and NOTIFY frames it may have unanswered.
    stream_credits: int = Field(default=1_000, ge=1, le=1_000_000)
    # The largest frame a session may send (the seed's note B1); unset: the largest message
    # plus room for its key and fields.
    stream_max_frame_bytes: int | None = Field(default=None, ge=1024)
    # Bytes of messages all sessions together may have written and not yet acknowledged by
    # Kafka; sessions stop being read beyond it, so the API's memory stays bounded.
    stream_buffer_bytes: int = Field(default=64 * MIB, ge=MIB)
    # How long a session may hold Kafka's acknowledgements back to answer several in one ACK
    # (docs/streaming.md, "Acknowledgements"); 0: one ACK per report round.
    stream_ack_delay_ms: int = Field(default=5, ge=0, le=10_000)
    stream_max_sessions: int = Field(default=1_000, ge=1)
    # Sessions one API key may hold at once on a replica; unset: a quarter of
    # SETU_STREAM_MAX_SESSIONS, so no one key takes every slot.
    stream_max_sessions_per_key: int | None = Field(default=None, ge=1)
    # Streams one session may have open at once (setu.client opens one per session).
    stream_max_streams_per_session: int = Field(default=100, ge=1)
    # Connections that have not yet said HELLO, counted apart from sessions: past it the one
    # that has waited longest is closed. A connection gets this long to send its HELLO.
    stream_max_pending: int = Field(default=256, ge=1)
    stream_hello_timeout_ms: int = Field(default=3_000, ge=100, le=60_000)
    # A session that sends nothing this long, while it holds credits and has no write waiting
    # for Kafka, is ended (ERROR request_timeout) and its streams are free: a client that went
    # silent or half-open holds nothing for longer. Clients send a BOUNDARY MESSAGE when idle
    # (setu.client every third of it); OK tells them the value.
    stream_idle_timeout_ms: int = Field(default=30_000, ge=500)
    # How long a dead API replica keeps its streams from other sessions (one writer each).
    stream_lease_ms: int = Field(default=10_000, ge=1_000)

    # Kafka
    kafka_replication_factor: int = 1
    # How long a subscription's DLQ keeps dead letters, parked ones included; unset: for
    # ever (docs/design.md §4: nothing parked expires unseen). Retry tiers keep their
    # topic's retention_hours.
    dead_letter_retention_hours: int | None = Field(default=None, ge=1)
    kafka_version: str = "4.1.1"
    # How every Kafka client connects (docs/security.md §8): SASL credentials and TLS, the same
    # for librdkafka and for Spark's Kafka source and sink.
    kafka_security_protocol: SecurityProtocol = SecurityProtocol.PLAINTEXT
    kafka_sasl_mechanism: SaslMechanism | None = None
    kafka_sasl_username: str | None = None
    kafka_sasl_password: SecretStr | None = None
    # PEM files: the certificates that sign the brokers' (unset: the system's), and the
    # client's private key with its certificate chain (for brokers that ask for one).
    kafka_ssl_ca_location: str | None = None
    kafka_ssl_keystore_location: str | None = None
    kafka_ssl_key_password: SecretStr | None = None
    kafka_ssl_endpoint_identification: bool = True

    # Ingest (Spark)
    # How the ingest query runs (docs/ingest.md, "Modes"): "real-time", Spark's real-time mode
    # (each record goes on as it arrives), or "micro-batch"; the same query and the same JVM
    # de-duplication operator either way (decisions 0008, 0009).
    ingest_mode: Literal["micro-batch", "real-time"] = "real-time"
    # Where produced records wait for the ingest job (docs/ingest.md, "Many topics"; decision
    # 0010): "per-topic", each topic's own ingest topic ``setu.{p}.{t}.ingest``, or "shared", one
    # log for every topic (SETU_INGEST_LOG_TOPIC, SETU_INGEST_LOG_PARTITIONS partitions) with the
    # topic in each record's header, so the real-time query's tasks do not grow with the topics.
    ingest_log: Literal["per-topic", "shared"] = "per-topic"
    ingest_log_topic: str = Field(default=SHARED_INGEST_LOG, pattern=SHARED_INGEST_LOG_PATTERN)
    ingest_log_partitions: int = Field(default=12, ge=1, le=10_000)
    # Task slots of a local Spark master in real-time mode, where every ingest partition read
    # and every shuffle partition holds one all the time (docs/ingest.md, "Modes").
    spark_realtime_slots: int = 64
    # Above this many ingest partitions the query runs in micro-batches instead: real-time mode
    # holds a task and a Kafka consumer per partition all the time (docs/ingest.md, "Many
    # topics").
    spark_realtime_max_partitions: int = Field(default=60, ge=1)
    # Seconds a real-time mode batch lasts: how often the query checkpoints, so at most how much
    # a crash replays (delivery skips it); records go on as they come all the same. Each batch
    # boundary pauses records for about half a second to two (docs/latency.md): 120 s keeps
    # those pauses out of the 99th percentile at 200 msg/s, where 30 s did not. Spark refuses
    # batches under 5 s (spark.sql.streaming.realTimeMode.minBatchDuration): the query failed
    # at every start instead of the setting being refused.
    spark_realtime_batch_s: int = Field(default=120, ge=5)
    spark_master: str = "local[2]"
    # Spark's Kafka connector (spark-sql-kafka-0-10) fetched from Maven Central: the newest
    # served there for the installed pyspark's major version, which may trail pyspark's own
    # (tests/unit/cli/test_jars.py holds it to that).
    spark_connector_version: str = "4.2.0"
    spark_jars: str | None = None
    spark_checkpoint_dir: str | None = None
    # More Spark properties for the ingest job, as a JSON object (they win over Setu's own):
    # executor memory and cores on a cluster, a checkpoint file system's credentials, ...
    spark_conf: dict[str, str] = Field(default_factory=dict)
    spark_trigger_ms: int = 250
    spark_max_offsets_per_trigger: int = 200_000
    spark_shuffle_partitions: int = 2
    spark_topic_refresh_ms: int = 5_000
    # Regex of the ingest topics the job reads; unset = every ``setu.*.ingest`` topic. Lets
    # tests and stacks that share one broker keep to their own projects.
    spark_ingest_pattern: str | None = None
    dedup_ttl_seconds: int = 24 * 3600
    dedup_max_producers: int = 100_000
    # Message ids remembered for de-duplication by message id (docs/ingest.md): as with the
    # producer marks, each ingest partition keeps 1/32 of them.
    dedup_max_message_ids: int = 3_200_000
    # Whether the API's GET /metrics (which needs no key) names projects and topics in its
    # labels; only where nobody but the scraper reaches it (docs/security.md §2).
    metrics_tenant_labels: bool = False
    # Where the ingest job serves GET /metrics (Prometheus); unset: not served.
    ingest_metrics_port: int | None = None
    ingest_metrics_host: str = "127.0.0.1"

    # Delivery
    worker_id: str | None = None
    # How long each message's attempts are kept for GET .../messages/{id} (docs/design.md §9);
    # 0 keeps none.
    attempt_log_hours: int = Field(default=24, ge=0, le=24 * 30)
    # How many offset commits a worker starts a second, once a burst of as many has started
    # (delivery/pace.py): with many subscriptions each one commits less often.
    delivery_commits_per_second: float = Field(default=100.0, gt=0, le=100_000)
    # Replays (docs/replays.md): the pace of one replay when its request names none, the
    # fastest a request may ask for (calls per second over the subscription's partitions),
    # and how many may run at once per subscription.
    replay_rate_per_second: float = Field(default=50.0, gt=0, le=100_000)
    replay_max_rate_per_second: float = Field(default=1_000.0, gt=0, le=100_000)
    replays_running_max: int = Field(default=4, ge=1, le=100)
    # How long after a replay's window ends a message the ingest job writes is still
    # replayed (the main log's time is the write's, a little after the produce).
    replay_settle_ms: int = Field(default=10_000, ge=0, le=3_600_000)
    # How often a worker lists every subscription whatever Redis's change count says: a
    # backstop, since every writer of a subscription's record raises that count and the
    # workers list at once when it moves (docs/delivery.md, "Workers hear of it within a
    # second"). Each listing reads and parses every subscription.
    subscription_refresh_ms: int = Field(default=30_000, ge=100)
    # How a worker reads: one reader per worker and topic shared by the topic's subscriptions,
    # each with its own cursor (``shared``, docs/decisions/0011-shared-readers.md), or the
    # earlier layout, a consumer of its own per subscription (``per-subscription``: its
    # threads and idle polling grow with every subscription; kept for rolling upgrades).
    delivery_readers: Literal["per-subscription", "shared"] = "shared"
    # The consumer group the workers of one installation share the main partitions in (with
    # shared readers).
    delivery_group: str = "setu.delivery"
    # Where a delivery worker serves GET /metrics (Prometheus); unset: not served.
    delivery_metrics_port: int | None = None
    delivery_metrics_host: str = "127.0.0.1"

    @model_validator(mode="after")
    def _kafka_security_agrees(self) -> Settings:
        """Contradictory Kafka security settings stop every process at its start."""
        self.kafka_security()
        return self

    @model_validator(mode="after")
    def _egress_proxies_parse(self) -> Settings:
        """A proxy URL that does not parse stops every process at its start."""
        self.egress()
        return self

    def shared_ingest_log(self) -> str | None:
        """The shared ingest log's name when ``SETU_INGEST_LOG=shared``, else None."""
        return self.ingest_log_topic if self.ingest_log == "shared" else None

    def shared_ingest_log_spec(self) -> tuple[str, int] | None:
        """(name, partitions) of the shared ingest log when there is one."""
        log = self.shared_ingest_log()
        return None if log is None else (log, self.ingest_log_partitions)

    def kafka_security(self) -> KafkaSecurity:
        """How Kafka clients connect; raises KafkaSecurityError (a ValueError) when the
        settings contradict each other."""
        return KafkaSecurity(
            protocol=self.kafka_security_protocol,
            mechanism=self.kafka_sasl_mechanism,
            username=self.kafka_sasl_username,
            password=self.kafka_sasl_password,
            ca_location=self.kafka_ssl_ca_location,
            keystore_location=self.kafka_ssl_keystore_location,
            key_password=self.kafka_ssl_key_password,
            verify_hostname=self.kafka_ssl_endpoint_identification,
        )

    def egress(self) -> Egress:
        """The egress proxies (SETU_EGRESS_PROXY, SETU_EGRESS_PROXIES), parsed."""
        default = self.egress_proxy.get_secret_value() if self.egress_proxy else None
        named = {name: url.get_secret_value() for name, url in self.egress_proxies.items()}
        return Egress.parse(default, named)

    def kafka_client_config(self) -> dict[str, str]:
        """The librdkafka entries every Kafka client of Setu adds to its own settings."""
        return self.kafka_security().librdkafka()

    def resolved_database_url(self) -> str:
        """The metadata store URL; SQLite inside the data dir unless set."""
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.data_dir / 'setu.db').resolve()}"

    def resolved_checkpoint_dir(self) -> str:
        """Where the ingest job checkpoints; inside the data dir unless set."""
        if self.spark_checkpoint_dir:
            return self.spark_checkpoint_dir
        return str((self.data_dir / "spark" / "checkpoint").resolve())


def is_local_master(master: str) -> bool:
    """``local``, ``local[N]`` and the like: Spark inside the job's process, no executors
    elsewhere."""
    return master.startswith("local")
