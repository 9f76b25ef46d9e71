from __future__ import annotations

from pathlib import Path

from cli.jars import jars_not_shipped, kafka_artifacts, spark_kafka_artifacts
from cli.jvm import pyspark_version
from setu.settings import Settings


def test_jars_pyspark_ships_are_left_out_whatever_their_version() -> None:
    # Given the connector's transitive jars and the artifacts pyspark ships
    fetched = [
        Path("c/spark-sql-kafka-0-10_2.13-4.2.0.jar"),
        Path("c/kafka-clients-3.9.2.jar"),
        Path("c/scala-library-2.13.15.jar"),
        Path("c/lz4-java-1.10.1.jar"),
    ]
    shipped = {"scala-library", "lz4-java", "spark-core_2.13"}
    # When the classpath additions are chosen
    kept = jars_not_shipped(fetched, shipped)
    # Then only the connector and what Spark lacks remain
    assert kept == [
        Path("c/spark-sql-kafka-0-10_2.13-4.2.0.jar"),
        Path("c/kafka-clients-3.9.2.jar"),
    ]


def test_the_broker_classpath_has_server_tools_and_a_log_binding() -> None:
    names = {a.artifact for a in kafka_artifacts("4.1.1")}
    assert {"kafka_2.13", "kafka-server", "kafka-tools"} <= names
    assert any("slf4j" in name for name in names)
    assert all(
        a.version == "4.1.1" for a in kafka_artifacts("4.1.1") if a.group == "org.apache.kafka"
    )


def test_the_spark_connector_matches_the_spark_version() -> None:
    (connector,) = spark_kafka_artifacts("4.2.0")
    assert (connector.group, connector.artifact, connector.version) == (
        "org.apache.spark",
        "spark-sql-kafka-0-10_2.13",
        "4.2.0",
    )


def test_the_connector_is_of_the_installed_sparks_major_version_and_not_newer() -> None:
    # Maven Central may not serve the connector of the newest Spark yet (4.3.0 was not, while
    # pyspark 4.3.0 was on PyPI): the newest served one of the same major version runs on it.
    runtime = tuple(int(x) for x in pyspark_version().split(".")[:2])
    connector = tuple(int(x) for x in Settings().spark_connector_version.split(".")[:2])
    assert connector[0] == runtime[0]
    assert connector <= runtime
