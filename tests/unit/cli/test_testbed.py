from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from cli.testbed import missing_services, render_env_file


@pytest.mark.parametrize(
    ("env", "missing"),
    [
        ({}, ["kafka", "redis", "postgres"]),
        ({"SETU_TEST_KAFKA_BOOTSTRAP": "127.0.0.1:9092"}, ["redis", "postgres"]),
        (
            {"SETU_TEST_REDIS_URL": "", "SETU_TEST_DATABASE_URL": "postgresql://x"},
            ["kafka", "redis"],
        ),
        (
            {
                "SETU_TEST_KAFKA_BOOTSTRAP": "k",
                "SETU_TEST_REDIS_URL": "r",
                "SETU_TEST_DATABASE_URL": "d",
            },
            [],
        ),
    ],
)
def test_only_services_not_given_are_started(env: dict[str, str], missing: list[str]) -> None:
    assert missing_services(env) == missing


def test_the_env_file_can_be_sourced_by_a_shell(tmp_path: Path) -> None:
    # Given values with characters a shell would interpret
    values = {"SETU_TEST_DATABASE_URL": "postgresql://u@h:1/d?a=1&b=$x", "SETU_TEST_REDIS_URL": "r"}
    path = tmp_path / "env"
    path.write_text(render_env_file(values))
    # When a shell sources it
    out = subprocess.run(
        ["sh", "-c", f'. "{path}"; printf "%s\\n" "$SETU_TEST_DATABASE_URL"'],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    # Then the value arrives unchanged
    assert out == "postgresql://u@h:1/d?a=1&b=$x\n"
