"""The install tests: Setu's image built here and the Helm chart's manifests run as pods.

Every test under tests/install carries the ``install`` mark, and runs only when asked for
(``-m install``; ``scripts/test-install`` does): building the image takes minutes, more than
CI's budget. The pods reach Kafka, Redis and PostgreSQL on this machine's own address, so the
services must listen there: ``scripts/test-install`` starts them so
(``setu services run --host``). ``SETU_TEST_IMAGE`` names an image already built (otherwise
``scripts/build-image`` builds one), ``HELM`` the helm binary (otherwise ``scripts/helm``).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.databases import fresh_database
from tests.install.kube import ROOT
from tests.install.support import Release
from tests.integration.delivery.support import Receiver, served_receiver

HERE = Path(__file__).resolve().parent
TEST_IMAGE = "localhost/setu:install-test"
PREVIOUS_IMAGE = "localhost/setu:install-previous"
# The version test_upgrade.py upgrades from (SETU_TEST_UPGRADE_FROM, a git revision, overrides
# it): the last one released before the newest schema migration (0007, endpoint access), so
# the upgrade migrates the database under the old pods. Move it on when a release is made.
PREVIOUS_RELEASE = "ee00170a3ed776b75c13a346eec9f813468ceef4"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in item.path.resolve().parents:
            item.add_marker(pytest.mark.install)


@pytest.fixture(scope="session")
def services_host(kafka_bootstrap: str) -> str:
    """The address the services listen on: pods reach it through podman's bridge."""
    host = urlsplit(f"//{kafka_bootstrap}").hostname or ""
    if host in ("127.0.0.1", "localhost", "::1"):
        pytest.fail(
            "the services listen on loopback, where pods cannot reach them: run these tests "
            "with scripts/test-install (services on this machine's address)"
        )
    return host


@pytest.fixture(scope="session")
def image() -> str:
    """The image under test: SETU_TEST_IMAGE, or one built now from this checkout."""
    given = os.environ.get("SETU_TEST_IMAGE")
    if given:
        return given
    subprocess.run([str(ROOT / "scripts" / "build-image"), "--tag", TEST_IMAGE], check=True)
    return TEST_IMAGE


@pytest.fixture(scope="module")
def database(postgres_url: str) -> Iterator[str]:
    """A fresh PostgreSQL database for one module's release, dropped afterwards."""
    with fresh_database(postgres_url, "setu_install") as url:
        yield url


@pytest.fixture(scope="session")
def helm() -> str:
    return os.environ.get("HELM") or str(ROOT / "scripts" / "helm")


@pytest.fixture
def webhook(services_host: str) -> Iterator[Receiver]:
    """A webhook on this machine's address, where the worker pods can call it."""
    with served_receiver(services_host) as rec:
        yield rec


@pytest.fixture(scope="session")
def previous_release(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Release]:
    """The previous release's source checked out beside this one, its image built with this
    checkout's Dockerfile (the build glue, not the release's code)."""
    revision = os.environ.get("SETU_TEST_UPGRADE_FROM", PREVIOUS_RELEASE)
    tree = tmp_path_factory.mktemp("previous") / "setu"
    git = ["git", "-C", str(ROOT)]
    subprocess.run([*git, "worktree", "add", "--detach", str(tree), revision], check=True)
    try:
        subprocess.run(
            [
                str(ROOT / "scripts" / "build-image"),
                "--tag",
                PREVIOUS_IMAGE,
                "--context",
                str(tree),
            ],
            check=True,
        )
        yield Release(revision, tree / "helm" / "setu", PREVIOUS_IMAGE)
    finally:
        subprocess.run([*git, "worktree", "remove", "--force", str(tree)], check=False)
