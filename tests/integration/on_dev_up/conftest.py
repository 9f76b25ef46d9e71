"""One `setu dev up` stack for every test of this package (the console in a browser, a real
Prometheus): starting the whole stack costs about a minute on a 2-core machine, so it is
started once and stopped, with Ctrl-C as a user stops it, after the package's last test.
Each test makes projects of its own names on it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.integration.delivery.support import Receiver, served_receiver
from tests.integration.on_dev_up.support import DevStack
from tests.integration.support_dev_up import START_TIMEOUT_S, dev_up, stack_ports


@pytest.fixture(scope="package")
def dev_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevStack]:
    ports = stack_ports()
    # The ingest lag gauge is set at each real-time batch's end (README, "Metrics"): 30 s
    # batches give Prometheus's lag panel data within its test's minute; the default 120 s
    # would not.
    batches = {"SETU_SPARK_REALTIME_BATCH_S": "30"}
    with dev_up(tmp_path_factory.mktemp("setu-data"), ports, env=batches) as up:
        up.wait_for_line(r"setu dev up: ready", START_TIMEOUT_S)
        api = up.wait_for_line(r"API\s+(http://\S+)", 5).group(1)
        metrics = up.wait_for_line(r"Metrics\s+(.+)", 5).group(1)
        key = up.wait_for_line(r"export SETU_API_KEY=(\S+)", 5).group(1)
        yield DevStack(up, ports, api, key, metrics)
        assert up.stop() == 0, "\n".join(up.seen[-40:])


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with served_receiver() as rec:
        yield rec
