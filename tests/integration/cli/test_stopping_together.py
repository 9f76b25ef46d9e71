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
# clean shutdown waits for a controller quorum that needs the other nodes), then takes a moment
# to close; asked a second time meanwhile, it is cut short (exit 2, as a process whose handler
# is gone would die of the signal).
PEER = """
import pathlib, signal, sys, time
me, peer = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
closing_s = float(sys.argv[3])

def leave(signum, frame):
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(2))
    me.touch()
    deadline = time.monotonic() + 30
    while not peer.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(closing_s)
    sys.exit(0 if peer.exists() else 1)

signal.signal(signal.SIGTERM, leave)
print("ready", flush=True)
while True:
    signal.pause()
"""


def peer_spec(tmp_path: Path, name: str, peer: str, closing_s: float) -> ChildSpec:
    argv = (sys.executable, "-c", PEER, str(tmp_path / name), str(tmp_path / peer), str(closing_s))
    return ChildSpec(name=name, argv=argv, log_path=tmp_path / f"{name}.log", stop_timeout_s=20)


def said_ready(child: Child) -> bool:
    return "ready" in child.log_tail().splitlines()


def test_children_started_together_are_stopped_together(tmp_path: Path) -> None:
    # Given two peers started together on a stack, the second slower to close
    stack = Stack(threading.Event(), lambda line: None)
    first, second = stack.start_together(
        [peer_spec(tmp_path, "a", "b", 0.1), peer_spec(tmp_path, "b", "a", 2)]
    )
    for child in (first, second):
        # The log's first lines are the command, which mentions "ready" too
        wait_for(f"{child.spec.name} ready", partial(said_ready, child))
    # When the stack stops
    started = time.monotonic()
    stack.stop_all()
    # Then both left cleanly at once: neither waited for its peer until it was killed, and
    # neither was asked twice (the second, still closing when the first had gone)
    assert (first.exit_code(), second.exit_code()) == (0, 0)
    assert time.monotonic() - started < 10
