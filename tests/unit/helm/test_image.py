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


def test_both_stages_start_from_the_base_argument() -> None:
    # The published build uses the registry's Python image, scripts/build-image a Debian base
    # made here: the venv built in the first stage runs on the same Python in the second.
    assert re.findall(r"^FROM (\S+)", DOCKERFILE, re.MULTILINE) == ["${BASE}", "${BASE}"]
    assert re.search(r"^ARG BASE=python:3\.11-slim-bookworm$", DOCKERFILE, re.MULTILINE)


def test_a_build_proxys_ca_is_trusted_by_the_build_stage_only() -> None:
    build_stage = DOCKERFILE.rsplit("\nFROM ", 1)[0]
    assert "--mount=type=secret,id=build-ca" in build_stage
    assert "build-ca" not in final_stage()
    # The final stage copies the venv and the cache, never the build stage's certificates
    assert re.findall(r"^COPY --from=build (\S+)", final_stage(), re.MULTILINE) == ["/opt/setu"]


def test_every_container_has_a_writable_tmp_on_its_read_only_root() -> None:
    assert VALUES["securityContext"]["readOnlyRootFilesystem"] is True
    templates = ROOT / "helm" / "setu" / "templates"
    for name in ("api", "delivery", "ingest", "migrate"):
        text = (templates / f"{name}.yaml").read_text()
        assert 'include "setu.commonMounts"' in text, name
        assert 'include "setu.commonVolumes"' in text, name
    helpers = (templates / "_helpers.tpl").read_text()
    assert "- {name: tmp, mountPath: /tmp}" in helpers
