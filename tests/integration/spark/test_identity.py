"""The ingest job's column copy of the Kafka key rule equals the rule (setu.envelope.kafka_key)."""

from __future__ import annotations

import datetime

import pytest
from pyspark.sql import SparkSession

from setu.envelope import Envelope, kafka_key
from spark.stream import KEY, operator_rows

pytestmark = [pytest.mark.integration, pytest.mark.spark]

CASES = [
    ("m-1", None),
    ("m-2", "g-1"),
    ("m-3", ""),  # an empty GroupId is still a GroupId
    ("mé-4", "grüppe"),
    ("m-5", "m-5"),
]


def test_the_jobs_key_column_is_the_kafka_key_rule(spark_session: SparkSession) -> None:
    rows = [
        (
            "setu.p.t.ingest",
            0,
            offset,
            b"{}",
            b"record key the job must not prefer",
            datetime.datetime.now(datetime.UTC),
            Envelope(message_id, b"{}", group_id=group_id).kafka_headers(),
        )
        for offset, (message_id, group_id) in enumerate(CASES)
    ]
    raw = spark_session.createDataFrame(
        rows,
        "topic string, partition int, offset long, value binary, key binary, "
        "timestamp timestamp, headers array<struct<key:string,value:binary>>",
    )
    keys = [bytes(row[KEY]) for row in operator_rows(raw).orderBy("offset").collect()]
    assert keys == [kafka_key(m, g) for m, g in CASES]
