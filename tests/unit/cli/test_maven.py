from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from cli.maven import (
    COMPLETE_MARKER,
    Artifact,
    artifact_name,
    copy_dependencies_command,
    fetched_jars,
    render_pom,
)

POM = "{http://maven.apache.org/POM/4.0.0}"


def test_the_pom_depends_on_exactly_the_requested_artifacts() -> None:
    # Given two coordinates
    wanted = [Artifact("org.apache.kafka", "kafka_2.13", "4.1.1"), Artifact("g", "a&b", "1")]
    # When a pom is rendered for them
    root = ET.fromstring(render_pom("kafka", wanted))
    # Then it is valid XML listing those dependencies, in order, escaped
    found = [
        (d.findtext(f"{POM}groupId"), d.findtext(f"{POM}artifactId"), d.findtext(f"{POM}version"))
        for d in root.iter(f"{POM}dependency")
    ]
    assert found == [("org.apache.kafka", "kafka_2.13", "4.1.1"), ("g", "a&b", "1")]


def test_the_pom_pins_the_dependency_plugin() -> None:
    root = ET.fromstring(render_pom("x", [Artifact("g", "a", "1")]))
    plugin = root.find(f"{POM}build/{POM}plugins/{POM}plugin")
    assert plugin is not None
    assert plugin.findtext(f"{POM}artifactId") == "maven-dependency-plugin"
    assert plugin.findtext(f"{POM}version")


def test_mvn_copies_runtime_dependencies_quietly_and_without_prompts() -> None:
    argv = copy_dependencies_command(Path("/w/pom.xml"), Path("/w/jars"))
    assert argv[0] == "mvn"
    assert {"-q", "-B", "dependency:copy-dependencies", "-DincludeScope=runtime"} <= set(argv)
    assert "-DoutputDirectory=/w/jars" in argv


@pytest.mark.parametrize(
    ("coordinate", "expected"),
    [
        ("org.apache.kafka:kafka_2.13:4.1.1", Artifact("org.apache.kafka", "kafka_2.13", "4.1.1")),
        ("g:a:1.0-SNAPSHOT", Artifact("g", "a", "1.0-SNAPSHOT")),
    ],
)
def test_coordinates_parse(coordinate: str, expected: Artifact) -> None:
    assert Artifact.parse(coordinate) == expected


@pytest.mark.parametrize("coordinate", ["g:a", "g:a:1:jar", "g::1", ""])
def test_malformed_coordinates_are_refused(coordinate: str) -> None:
    with pytest.raises(ValueError, match="coordinate"):
        Artifact.parse(coordinate)


@pytest.mark.parametrize(
    ("jar", "artifact"),
    [
        ("kafka_2.13-4.1.1.jar", "kafka_2.13"),
        ("kafka-clients-3.9.2.jar", "kafka-clients"),
        ("spark-sql-kafka-0-10_2.13-4.2.0.jar", "spark-sql-kafka-0-10_2.13"),
        ("scala-parallel-collections_2.13-1.2.0.jar", "scala-parallel-collections_2.13"),
        ("zstd-jni-1.5.6-10.jar", "zstd-jni"),
        ("javassist-3.30.2-GA.jar", "javassist"),
        ("jsr305-3.0.0.jar", "jsr305"),
        ("re2j-1.8.jar", "re2j"),
        ("commons-pool2-2.13.1.jar", "commons-pool2"),
        ("hadoop-client-api-3.5.0.jar", "hadoop-client-api"),
        ("unversioned.jar", "unversioned"),
    ],
)
def test_artifact_names_drop_only_the_version(jar: str, artifact: str) -> None:
    assert artifact_name(jar) == artifact


def test_an_unfinished_fetch_is_not_taken_as_done(tmp_path: Path) -> None:
    # Given a folder with jars but no completion marker (a fetch that was interrupted)
    (tmp_path / "a-1.0.jar").write_bytes(b"")
    # Then it does not count as fetched
    assert fetched_jars(tmp_path) is None
    # And once the marker exists, its jars are the result
    (tmp_path / COMPLETE_MARKER).write_text("a-1.0.jar")
    assert fetched_jars(tmp_path) == [tmp_path / "a-1.0.jar"]
