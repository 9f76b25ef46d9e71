"""The ingest job against the real broker, Redis and Spark (local[2]).

One SparkSession serves every test here (starting one costs seconds on two cores). Each test
uses its own project, and its query subscribes to that project's ingest topics only, so tests
never read or write topics of anyone else on the shared broker.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from cli.jars import resolve_spark_jars
from cli.jvm import ingest_jar
from setu.settings import Settings
from spark import job
from tests.integration.spark.support import IngestWorld


@pytest.fixture(scope="session")
def spark_session(kafka_bootstrap: str, redis_url: str) -> Iterator[SparkSession]:
    jars = [*resolve_spark_jars(Settings()), ingest_jar(Settings())]
    settings = Settings(
        kafka_bootstrap=kafka_bootstrap,
        redis_url=redis_url,
        spark_jars=",".join(map(str, jars)),
        spark_shuffle_partitions=2,
    )
    spark = job.build_session(settings)
    spark.sparkContext.setLogLevel("ERROR")
    yield spark
    spark.stop()


@pytest.fixture
def world(
    spark_session: SparkSession, kafka_bootstrap: str, redis_url: str, tmp_path: Path
) -> Iterator[IngestWorld]:
    w = IngestWorld(spark_session, kafka_bootstrap, redis_url, tmp_path)
    yield w
    w.close()
