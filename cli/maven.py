"""Fetch jars from Maven Central with ``mvn``: a generated pom, then ``copy-dependencies``.

A fetched folder holds the jars plus a ``.complete`` marker written last, so an interrupted
fetch is redone and a finished one is never fetched again.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from xml.sax.saxutils import escape

# Pinned so the same plugin runs everywhere, whatever Maven's own default is.
DEPENDENCY_PLUGIN_VERSION = "3.8.1"
COMPLETE_MARKER = ".complete"

# A Maven jar file name ends in "-<version>.jar", the version starting "<digits>.<digits>".
_VERSIONED_JAR = re.compile(r"-(\d+(?:\.\d+)+(?:[-.][A-Za-z0-9_.]+)?)\.jar$")


class FetchFailed(Exception):
    """Raised when ``mvn`` is missing or cannot resolve the requested artifacts."""


@dataclass(frozen=True)
class Artifact:
    """One Maven coordinate, ``group:artifact:version``."""

    group: str
    artifact: str
    version: str

    @classmethod
    def parse(cls, coordinate: str) -> Artifact:
        """``"org.apache.kafka:kafka_2.13:4.1.1"`` → Artifact; anything else → ValueError."""
        parts = coordinate.split(":")
        if len(parts) != 3 or not all(parts):
            raise ValueError(f"not a group:artifact:version coordinate: {coordinate!r}")
        return cls(*parts)


def render_pom(name: str, artifacts: Sequence[Artifact]) -> str:
    """A pom whose only purpose is to depend on ``artifacts`` (runtime scope, transitively)."""
    dependencies = "\n".join(
        "    <dependency>"
        f"<groupId>{escape(a.group)}</groupId>"
        f"<artifactId>{escape(a.artifact)}</artifactId>"
        f"<version>{escape(a.version)}</version>"
        "</dependency>"
        for a in artifacts
    )
    return f"""<?xml version="1.0" encoding="UTF-8"?>
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>setu.local</groupId>
  <artifactId>{escape(name)}</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
{dependencies}
  </dependencies>
  <build>
    <plugins>
      <plugin>
        <groupId>org.apache.maven.plugins</groupId>
        <artifactId>maven-dependency-plugin</artifactId>
        <version>{DEPENDENCY_PLUGIN_VERSION}</version>
      </plugin>
    </plugins>
  </build>
</project>
"""


def copy_dependencies_command(pom: Path, output_dir: Path) -> list[str]:
    """The ``mvn`` invocation that copies every runtime jar of ``pom`` into ``output_dir``."""
    return [
        "mvn",
        "-q",
        "-B",
        "-f",
        str(pom),
        "dependency:copy-dependencies",
        f"-DoutputDirectory={output_dir}",
        "-DincludeScope=runtime",
    ]


def artifact_name(jar_file_name: str) -> str:
    """The artifact id of a Maven jar file name: ``"kafka_2.13-4.1.1.jar"`` → ``"kafka_2.13"``.

    A name without a recognisable version is returned without its ``.jar`` suffix.
    """
    match = _VERSIONED_JAR.search(jar_file_name)
    if match:
        return jar_file_name[: match.start()]
    return jar_file_name.removesuffix(".jar")


def fetched_jars(folder: Path) -> list[Path] | None:
    """The jars of a completed fetch into ``folder``, sorted; None if it never completed."""
    if not (folder / COMPLETE_MARKER).is_file():
        return None
    return sorted(folder.glob("*.jar"))


def fetch(name: str, artifacts: Sequence[Artifact], folder: Path) -> list[Path]:
    """Jars of ``artifacts`` and their runtime dependencies, fetched into ``folder`` once.

    Raises FetchFailed when ``mvn`` is missing or fails; ``folder`` is then left as it was.
    """
    done = fetched_jars(folder)
    if done is not None:
        return done
    if shutil.which("mvn") is None:
        raise FetchFailed("mvn is not installed: run scripts/install (or apt-get install maven)")
    work = folder.with_name(folder.name + ".partial")
    shutil.rmtree(work, ignore_errors=True)
    jars = work / "jars"
    jars.mkdir(parents=True)
    pom = work / "pom.xml"
    pom.write_text(render_pom(name, artifacts))
    result = subprocess.run(
        copy_dependencies_command(pom, jars),
        capture_output=True,
        text=True,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    if result.returncode != 0:
        wanted = ", ".join(f"{a.group}:{a.artifact}:{a.version}" for a in artifacts)
        raise FetchFailed(f"mvn could not fetch {wanted}:\n{result.stdout}{result.stderr}")
    (jars / COMPLETE_MARKER).write_text("\n".join(sorted(p.name for p in jars.glob("*.jar"))))
    shutil.rmtree(folder, ignore_errors=True)
    folder.parent.mkdir(parents=True, exist_ok=True)
    jars.rename(folder)
    shutil.rmtree(work, ignore_errors=True)
    return sorted(folder.glob("*.jar"))
