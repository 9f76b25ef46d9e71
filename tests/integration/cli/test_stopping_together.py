"""Children started together on a stack are stopped together: the nodes of a Kafka cluster,
whose last node could not stop alone (cli/kafka_cluster.py)."""

from __future__ import annotations

import sys
import threading
import time
from functools import partial
from pathlib import Path

from cli.processes import Child, ChildSpec
from cli.stack import Stack
from tests.waiting import wait_for

# A child that, asked to stop, leaves only once its peer has been asked too (as a broker's
# clean shutdown waits for a controller quorum that needs the other nodes).
PEER = """
import pathlib, signal, sys, time
me, peer = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])

def leave(signum, frame):
    me.touch()
    deadline = time.monotonic() + 30
    while not peer.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    sys.exit(0 if peer.exists() else 1)

signal.signal(signal.SIGTERM, leave)
print("ready", flush=True)
while True:
    signal.pause()
"""


def peer_spec(tmp_path: Path, name: str, peer: str) -> ChildSpec:
    argv = (sys.executable, "-c", PEER, str(tmp_path / name), str(tmp_path / peer))
    return ChildSpec(name=name, argv=argv, log_path=tmp_path / f"{name}.log", stop_timeout_s=20)


def said_ready(child: Child) -> bool:
    return "ready" in child.log_tail().splitlines()


def test_children_started_together_are_stopped_together(tmp_path: Path) -> None:
    # Given two peers started together on a stack
    stack = Stack(threading.Event(), lambda line: None)
    first, second = stack.start_together(
        [peer_spec(tmp_path, "a", "b"), peer_spec(tmp_path, "b", "a")]
    )
    for child in (first, second):
        # The log's first lines are the command, which mentions "ready" too
        wait_for(f"{child.spec.name} ready", partial(said_ready, child))
    # When the stack stops
    started = time.monotonic()
    stack.stop_all()
    # Then both left cleanly at once: neither waited for its peer until it was killed
    assert (first.exit_code(), second.exit_code()) == (0, 0)
    assert time.monotonic() - started < 10
