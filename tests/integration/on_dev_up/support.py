"""What the tests of this package get from their shared `setu dev up` stack (conftest.py)."""

from __future__ import annotations

from dataclasses import dataclass

from tests.integration.support_dev_up import DevUp


@dataclass(frozen=True)
class DevStack:
    """A running stack and what its ready banner printed."""

    up: DevUp
    ports: dict[str, int]
    api: str  # the API's base URL
    key: str  # the admin key
    metrics: str  # the banner's Metrics line: "api http://…, ingest http://…, worker http://…"
