"""The Dockerfile builds the image the chart expects: every package, the same user and cache."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[3]
DOCKERFILE = (ROOT / "Dockerfile").read_text()
VALUES = yaml.safe_load((ROOT / "helm" / "setu" / "values.yaml").read_text())


def final_stage() -> str:
    return DOCKERFILE.rsplit("\nFROM ", 1)[1]


def test_the_image_holds_every_package_the_project_installs() -> None:
    # Given the packages pyproject.toml installs
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = project["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = {p.rstrip("*") for p in patterns}
    # Then the build stage copies each of them before `pip install`
    copied = set(re.findall(r"^COPY (\w+)/ \1/$", DOCKERFILE, re.MULTILINE))
    assert copied == packages


def test_the_image_bakes_the_spark_connector_where_the_chart_looks_for_it() -> None:
    assert "setu fetch --spark-only" in DOCKERFILE
    cache = VALUES["config"]["SETU_CACHE_DIR"]
    assert f"SETU_CACHE_DIR={cache}" in final_stage()


def test_the_image_runs_as_the_user_the_chart_requires() -> None:
    user = VALUES["podSecurityContext"]["runAsUser"]
    assert re.search(rf"^USER {user}$", final_stage(), re.MULTILINE)
    assert f"--uid {user}" in final_stage()


def test_the_runtime_has_java_for_spark_and_no_build_tools() -> None:
    runtime = final_stage()
    assert "openjdk-17-jre-headless" in runtime
    assert "maven" not in runtime
