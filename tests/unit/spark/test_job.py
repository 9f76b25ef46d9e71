"""The ingest job's Spark settings, as chosen from Setu's."""

from __future__ import annotations

from pathlib import Path

import pytest

from setu.settings import Settings
from spark.job import LOCAL_CHECKPOINT_FILE_MANAGER, is_local_path, session_config

MANAGER = "spark.sql.streaming.checkpointFileManagerClass"


@pytest.mark.parametrize(
    ("path", "local"),
    [
        ("/var/lib/setu/checkpoint", True),
        ("relative/checkpoint", True),
        ("file:///var/lib/setu/checkpoint", True),
        ("hdfs://namenode:8020/setu/checkpoint", False),
        ("s3a://bucket/setu/checkpoint", False),
    ],
)
def test_only_plain_paths_and_file_uris_are_local(path: str, local: bool) -> None:
    assert is_local_path(path) is local


def test_a_local_checkpoint_is_written_without_forking_per_file(tmp_path: Path) -> None:
    # Given a checkpoint on the local disk (the default, inside the data dir)
    conf = session_config(Settings(data_dir=tmp_path))
    # Then the rename-in-place file manager is used
    assert conf[MANAGER] == LOCAL_CHECKPOINT_FILE_MANAGER


def test_a_remote_checkpoint_keeps_spark_default_file_manager() -> None:
    # Given a checkpoint on HDFS, where only the default manager renames atomically
    conf = session_config(Settings(spark_checkpoint_dir="hdfs://nn:8020/setu/checkpoint"))
    # Then Spark's default stays
    assert MANAGER not in conf
