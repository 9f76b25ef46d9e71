"""The crash test's command: a run ended by SIGTERM still stops what it started."""

from __future__ import annotations

import signal
import subprocess
import sys

SCRIPT = """
import time
from bench.crash.__main__ import exit_on_sigterm
exit_on_sigterm()
try:
    print("running", flush=True)
    time.sleep(60)
finally:
    print("stopped everything", flush=True)
"""


def test_sigterm_runs_the_runs_finally_blocks() -> None:
    process = subprocess.Popen([sys.executable, "-c", SCRIPT], stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "running"
    process.send_signal(signal.SIGTERM)
    out, _ = process.communicate(timeout=30)
    assert "stopped everything" in out
    assert process.returncode == 128 + signal.SIGTERM
