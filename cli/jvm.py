"""The ingest job's JVM part: Setu's de-duplication operator, built from ``spark/jvm`` here.

The Java sources are compiled with ``javac`` against the jars of the installed pyspark, so the
operator always matches the Spark it runs in, and packed into a jar in the cache dir named by a
digest of the sources and the pyspark version: a changed source or another Spark builds anew,
an unchanged one is built once. ``-Xlint:all -Werror`` makes every compiler warning an error
(the lint step of the Java code; only warnings about the manifests of pyspark's own jars are
off); the unit tests under ``spark/jvm/src/test`` run with JUnit's console launcher
(``tests/unit/spark/test_jvm_units.py``).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import subprocess
import tempfile
import zipfile
from collections.abc import Iterable, Sequence
from pathlib import Path

from cli.maven import Artifact, fetch
from setu.settings import Settings

JVM_DIR = Path(__file__).resolve().parent.parent / "spark" / "jvm"
MAIN_SOURCES = JVM_DIR / "src" / "main" / "java"
TEST_SOURCES = JVM_DIR / "src" / "test" / "java"
JUNIT = Artifact("org.junit.platform", "junit-platform-console-standalone", "1.13.4")
# Every compiler warning is an error, but for "path": some of pyspark's jars name jars in their
# manifests that pyspark does not ship.
JAVAC_FLAGS = ("-Xlint:all,-path", "-Werror", "-proc:none", "--release", "17", "-encoding", "UTF-8")


# What Spark's own launcher gives a JVM on Java 17 (its JavaModuleOptions), for the unit tests
# that start a local Spark context.
SPARK_JAVA_OPTIONS = (
    "-XX:+IgnoreUnrecognizedVMOptions",
    *(
        f"--add-opens=java.base/{package}=ALL-UNNAMED"
        for package in (
            "java.lang",
            "java.lang.invoke",
            "java.lang.reflect",
            "java.io",
            "java.net",
            "java.nio",
            "java.util",
            "java.util.concurrent",
            "java.util.concurrent.atomic",
            "jdk.internal.ref",
            "sun.nio.ch",
            "sun.nio.cs",
            "sun.security.action",
            "sun.util.calendar",
        )
    ),
    "-Djdk.reflect.useDirectMethodHandle=false",
    "-Dio.netty.tryReflectionSetAccessible=true",
)


class BuildFailed(Exception):
    """``javac`` is missing or refused the sources (its output is the message)."""


def pyspark_jars() -> Path:
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        raise BuildFailed("pyspark is not installed")
    return Path(spec.origin).parent / "jars"


def pyspark_version() -> str:
    import pyspark

    return str(pyspark.__version__)


def compile_classpath() -> list[Path]:
    """The jars the operator's sources compile against: pyspark's own."""
    return sorted(pyspark_jars().glob("*.jar"))


def sources(root: Path) -> list[Path]:
    return sorted(root.rglob("*.java"))


def digest(files: Iterable[Path], *extra: str) -> str:
    h = hashlib.sha256()
    for part in extra:
        h.update(part.encode() + b"\0")
    for path in files:
        h.update(str(path.relative_to(JVM_DIR)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def javac(files: Sequence[Path], classpath: Sequence[Path], out: Path) -> None:
    """Compiles ``files`` into ``out``; raises BuildFailed with javac's output."""
    tool = shutil.which("javac")
    if tool is None:
        raise BuildFailed("javac not found: install a JDK (scripts/install does)")
    out.mkdir(parents=True, exist_ok=True)
    command = [tool, *JAVAC_FLAGS, "-d", str(out)]
    if classpath:
        command += ["-cp", os.pathsep.join(str(p) for p in classpath)]
    done = subprocess.run([*command, *map(str, files)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise BuildFailed(f"javac failed:\n{done.stdout}{done.stderr}")


def pack(classes: Path, jar: Path) -> None:
    """``classes`` as a jar, written under a temporary name and renamed into place."""
    jar.parent.mkdir(parents=True, exist_ok=True)
    partial = jar.with_name(f".{jar.name}.{os.getpid()}.tmp")
    with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as out:
        out.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\r\n\r\n")
        for path in sorted(classes.rglob("*.class")):
            out.write(path, path.relative_to(classes).as_posix())
    partial.replace(jar)


def ingest_jar(settings: Settings) -> Path:
    """The operator's jar for the installed pyspark, built on first use. Raises BuildFailed."""
    files = sources(MAIN_SOURCES)
    jar = (
        settings.cache_dir.resolve()
        / "jvm"
        / (f"setu-ingest-{digest(files, pyspark_version())}.jar")
    )
    if jar.exists():
        return jar
    with tempfile.TemporaryDirectory(prefix="setu-javac-") as work:
        javac(files, compile_classpath(), Path(work))
        pack(Path(work), jar)
    return jar


def junit_jar(settings: Settings) -> Path:
    """JUnit's console launcher (Maven Central, cached). Raises FetchFailed."""
    jars = fetch(f"junit-{JUNIT.version}", [JUNIT], settings.cache_dir.resolve() / "junit")
    return next(j for j in jars if j.name.startswith(JUNIT.artifact))


def run_unit_tests(settings: Settings, reports: Path) -> subprocess.CompletedProcess[str]:
    """Compiles the Java unit tests against the operator and runs them all with JUnit; the
    launcher's XML reports go to ``reports``. Returns the launcher's run (exit 0: all passed)."""
    jar = ingest_jar(settings)
    junit = junit_jar(settings)
    runtime = [jar, *compile_classpath()]
    with tempfile.TemporaryDirectory(prefix="setu-javac-tests-") as work:
        classes = Path(work)
        javac(sources(TEST_SOURCES), [jar, junit, *compile_classpath()], classes)
        java = shutil.which("java") or "java"
        return subprocess.run(
            [
                java,
                *SPARK_JAVA_OPTIONS,
                "-jar",
                str(junit),
                "execute",
                "--disable-banner",
                "--fail-if-no-tests",
                "--details=summary",
                "--class-path",
                os.pathsep.join(str(p) for p in [classes, *runtime]),
                "--scan-class-path",
                str(classes),
                "--reports-dir",
                str(reports),
            ],
            capture_output=True,
            text=True,
            check=False,
        )


def lint() -> None:
    """Compiles the operator and its tests with every warning an error (scripts/lint)."""
    with tempfile.TemporaryDirectory(prefix="setu-javac-lint-") as work:
        main, tests = Path(work) / "main", Path(work) / "test"
        javac(sources(MAIN_SOURCES), compile_classpath(), main)
        junit = junit_jar(Settings())
        javac(sources(TEST_SOURCES), [main, junit, *compile_classpath()], tests)


if __name__ == "__main__":
    try:
        lint()
    except BuildFailed as error:
        raise SystemExit(str(error)) from None
