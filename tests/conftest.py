"""Shared fixtures. Integration tests use the real services named by environment variables.

`scripts/test` (and CI) start Kafka, Redis and PostgreSQL and export:
  SETU_TEST_KAFKA_BOOTSTRAP   e.g. 127.0.0.1:9092
  SETU_TEST_REDIS_URL         e.g. redis://127.0.0.1:6379/0
  SETU_TEST_DATABASE_URL      e.g. postgresql+psycopg://postgres@127.0.0.1:5432/postgres
A missing variable fails the test that needs it: integration tests never skip silently.
"""

from __future__ import annotations

import faulthandler
import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.databases import fresh_database

# How long the process may take to exit once the run has ended and its summary is printed.
EXIT_GRACE_S = 120.0


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Ends the process if it is still there :data:`EXIT_GRACE_S` after the run, with the
    run's exit status and every thread's stack: a client library's thread that a test left
    behind must not hold the result (or CI) at interpreter exit."""

    def end_if_stuck() -> None:
        time.sleep(EXIT_GRACE_S)
        print(
            f"tests: the process has not exited {EXIT_GRACE_S:.0f} s after the run; "
            f"its threads follow, then it ends with the run's status {int(exitstatus)}",
            file=sys.stderr,
            flush=True,
        )
        faulthandler.dump_traceback(all_threads=True)
        os._exit(int(exitstatus))

    threading.Thread(target=end_if_stuck, name="exit-watchdog", daemon=True).start()


INSTALL_TESTS = Path(__file__).resolve().parent / "install"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The install tests (tests/install) and the long runs (marked ``long``) run only when
    the mark expression names them (``-m install``, as scripts/test-install does; ``-m
    long``, as scripts/test-long does): the image alone takes longer to build than the rest
    of the run allows, and the long runs would take CI past its time. The others leave them
    out as deselected."""
    wanted = config.option.markexpr or ""
    left_out = [
        item
        for item in items
        if ("install" not in wanted and INSTALL_TESTS in item.path.resolve().parents)
        or ("long" not in wanted and item.get_closest_marker("long") is not None)
    ]
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        dropped = set(map(id, left_out))
        items[:] = [item for item in items if id(item) not in dropped]


def _required_env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        pytest.fail(f"{name} is not set: run the tests through scripts/test, which starts services")
    return value


@pytest.fixture(scope="session")
def kafka_bootstrap() -> str:
    return _required_env("SETU_TEST_KAFKA_BOOTSTRAP")


@pytest.fixture(scope="session")
def redis_url() -> str:
    return _required_env("SETU_TEST_REDIS_URL")


@pytest.fixture(scope="session")
def postgres_url() -> str:
    return _required_env("SETU_TEST_DATABASE_URL")


@pytest.fixture
def pg_url(postgres_url: str) -> Iterator[str]:
    """A fresh PostgreSQL database for one test, dropped afterwards."""
    with fresh_database(postgres_url) as url:
        yield url
