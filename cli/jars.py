"""The jars Setu runs with: Apache Kafka's broker and Spark's official Kafka connector.

Both come from Maven Central through ``mvn`` into the cache dir, once per version.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable
from pathlib import Path

from cli.maven import Artifact, artifact_name, fetch
from setu.settings import Settings

# Kafka 4 logs through slf4j 1.x to log4j2; the broker's jars leave the binding to the distribution.
KAFKA_LOG_BINDING = Artifact("org.apache.logging.log4j", "log4j-slf4j-impl", "2.24.3")


def kafka_artifacts(version: str) -> list[Artifact]:
    """What a KRaft broker needs on its classpath (the broker, its tools, a log binding)."""
    return [
        Artifact("org.apache.kafka", "kafka_2.13", version),
        Artifact("org.apache.kafka", "kafka-server", version),
        Artifact("org.apache.kafka", "kafka-tools", version),
        KAFKA_LOG_BINDING,
    ]


def spark_kafka_artifacts(spark_connector_version: str) -> list[Artifact]:
    """Spark's Structured Streaming Kafka source and sink, for Scala 2.13."""
    return [Artifact("org.apache.spark", "spark-sql-kafka-0-10_2.13", spark_connector_version)]


def kafka_libs_dir(settings: Settings) -> Path:
    return settings.cache_dir.resolve() / f"kafka-{settings.kafka_version}" / "libs"


def spark_jars_dir(settings: Settings) -> Path:
    return settings.cache_dir.resolve() / f"spark-kafka-{settings.spark_connector_version}"


def resolve_kafka_jars(settings: Settings) -> list[Path]:
    """The broker's classpath, fetched on first use. Raises FetchFailed."""
    return fetch(
        f"kafka-{settings.kafka_version}",
        kafka_artifacts(settings.kafka_version),
        kafka_libs_dir(settings),
    )


def resolve_spark_jars(settings: Settings) -> list[Path]:
    """The connector jars to add to Spark, without those pyspark already ships.

    Shipped jars win because the connector's transitive versions (Scala, Hadoop, lz4) may be
    older than the ones Spark itself was built and tested with. Raises FetchFailed.
    """
    jars = fetch(
        f"spark-kafka-{settings.spark_connector_version}",
        spark_kafka_artifacts(settings.spark_connector_version),
        spark_jars_dir(settings),
    )
    return jars_not_shipped(jars, pyspark_shipped_artifacts())


def jars_not_shipped(jars: Iterable[Path], shipped: set[str]) -> list[Path]:
    """``jars`` minus those whose artifact id is in ``shipped`` (whatever their version)."""
    return [jar for jar in jars if artifact_name(jar.name) not in shipped]


def pyspark_shipped_artifacts() -> set[str]:
    """Artifact ids of the jars inside the installed pyspark; empty if pyspark is absent."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        return set()
    jars_dir = Path(spec.origin).parent / "jars"
    return {artifact_name(jar.name) for jar in jars_dir.glob("*.jar")}
