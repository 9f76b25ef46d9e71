"""Settings of the local stack only (``setu dev up`` and the test services), ``SETU_DEV_*``.

They are not part of :class:`setu.settings.Settings` because no Setu process reads them.
"""

from __future__ import annotations

from pydantic import field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

# One broker, or a cluster of three that keeps every acknowledged write when one node fails.
KAFKA_BROKER_COUNTS = (1, 3)


class DevSettings(BaseSettings):
    """Ports and sizes of the broker and Redis that the CLI starts on this machine.

    An unset port means "the one used last time, else the usual one, else any free one".
    """

    model_config = SettingsConfigDict(env_prefix="SETU_DEV_", extra="ignore")

    kafka_port: int | None = None
    kafka_controller_port: int | None = None
    redis_port: int | None = None
    # Each broker's heap.
    kafka_heap: str = "512m"
    # 3: a cluster of three nodes (cli/kafka_cluster.py), topics with three replicas.
    kafka_brokers: int = 1
    # Run the ingest job on a local Spark standalone cluster of this many workers (one core
    # and ``spark_worker_memory`` each) instead of inside its own process (0).
    spark_workers: int = 0
    spark_worker_memory: str = "1g"
    spark_master_port: int | None = None
    spark_ui_port: int | None = None
    # Kafka, Spark and the API share two cores at start-up: be patient.
    ready_timeout_s: float = 120.0

    @field_validator("kafka_brokers")
    @classmethod
    def _a_supported_broker_count(cls, count: int) -> int:
        if count not in KAFKA_BROKER_COUNTS:
            raise ValueError(f"must be one of {KAFKA_BROKER_COUNTS}")
        return count
