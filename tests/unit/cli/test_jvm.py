"""Building the ingest job's de-duplication operator (cli/jvm.py)."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from cli import jvm
from setu.settings import Settings


def test_a_compiler_warning_fails_the_build(tmp_path: Path) -> None:
    source = tmp_path / "Raw.java"
    source.write_text(
        "class Raw { void f() { java.util.List l = new java.util.ArrayList(); l.add(1); } }\n"
    )
    with pytest.raises(jvm.BuildFailed, match="warning"):
        jvm.javac([source], [], tmp_path / "classes")


def test_the_operator_is_built_once_per_source_and_spark_version(tmp_path: Path) -> None:
    settings = Settings(cache_dir=tmp_path)
    jar = jvm.ingest_jar(settings)
    built_at = jar.stat().st_mtime_ns
    assert jvm.ingest_jar(settings) == jar
    assert jar.stat().st_mtime_ns == built_at
    with zipfile.ZipFile(jar) as archive:
        assert "setu/ingest/IngestDedup.class" in archive.namelist()
    sources = jvm.sources(jvm.MAIN_SOURCES)
    assert jvm.digest(sources, jvm.pyspark_version()) in jar.name
    assert jvm.digest(sources, "another-spark") != jvm.digest(sources, jvm.pyspark_version())
