"""A worker's Kafka clients outlive an outage: Kafka down, a request given up on, Kafka back.

The subscriptions' offsets client (state/group_offsets.py) asks for a group's members while
the broker is down and gives up after its own deadline; then the broker starts. A group
request whose own deadline passed during the outage made the client library abort the
process once Kafka was back (decision 0011, "The crash test with 100 subscriptions"). The
client runs in a child process here, so that an abort is seen as its exit status.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli.jars import resolve_kafka_jars
from cli.kafka_local import KafkaNode, LocalKafka
from cli.ports import any_free_port
from cli.probes import kafka_answers
from cli.stack import Stack
from setu.settings import Settings

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]

# The client's side: give up while Kafka is down, then ask again until it answers, and stay
# a while after (the abort came when the broker returned, not at the request).
CLIENT = """
import asyncio, sys
from confluent_kafka import KafkaException
from state.group_offsets import GroupOffsets

async def main() -> None:
    offsets = GroupOffsets(sys.argv[1])
    for group in ("a", "b", "c"):
        try:
            await offsets.has_members(group, timeout_s=1.0)
            sys.exit(2)  # Kafka is down: no answer is possible
        except (TimeoutError, KafkaException):
            pass
    print("gave up while Kafka was down", flush=True)
    for _ in range(180):
        try:
            members = await offsets.has_members("a", timeout_s=2.0)
        except Exception:
            await asyncio.sleep(0.5)
            continue
        print(f"answered: members={members}", flush=True)
        await asyncio.sleep(5.0)
        print("still running", flush=True)
        return
    sys.exit(3)

asyncio.run(main())
"""


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[tuple[LocalKafka, Stack, str]]:
    """A broker on free loopback ports, prepared but not started."""
    node = KafkaNode(any_free_port(), any_free_port(), tmp_path / "kafka" / "data")
    libs = resolve_kafka_jars(Settings())[0].parent
    kafka = LocalKafka(tmp_path / "kafka", node, libs, tmp_path / "kafka.log", "512m")
    kafka.prepare()
    stack = Stack(threading.Event(), lambda line: None)
    try:
        yield kafka, stack, node.bootstrap
    finally:
        stack.stop_all()


def test_the_offsets_client_survives_kafka_coming_back_after_it_gave_up(
    broker: tuple[LocalKafka, Stack, str], tmp_path: Path
) -> None:
    kafka, stack, bootstrap = broker
    # Given the client asking for group members while Kafka is down, and giving up
    errors = tmp_path / "client.err"
    client = subprocess.Popen(
        [sys.executable, "-c", CLIENT, bootstrap],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=errors.open("wb"),
        text=True,
    )
    try:
        assert client.stdout is not None
        first = client.stdout.readline()
        assert first.strip() == "gave up while Kafka was down", first
        # When Kafka starts
        stack.start(kafka.child_spec(), lambda: kafka_answers(bootstrap, {}), 120)
        # Then the client answers again and is still running seconds later
        output = first + client.communicate(timeout=180)[0]
    finally:
        if client.poll() is None:
            client.kill()
    assert client.returncode == 0, output + errors.read_text()[-2000:]
    assert "answered: members=False" in output and "still running" in output
