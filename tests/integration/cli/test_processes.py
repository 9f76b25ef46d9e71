"""Children of `setu dev up` and `setu services`: real processes, stopped for good."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from cli.processes import EXIT_NOT_AVAILABLE, Child, ChildSpec
from cli.supervisor import Supervisor, restart_delay
from tests.waiting import wait_for


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it no longer runs.
    state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    return state != "Z"


def python_child(tmp_path: Path, code: str, **spec: object) -> Child:
    return Child(
        ChildSpec(
            name="child",
            argv=(sys.executable, "-c", code),
            log_path=tmp_path / "child.log",
            **spec,  # type: ignore[arg-type]
        )
    )


def test_a_child_that_ignores_sigterm_is_killed_after_its_timeout(tmp_path: Path) -> None:
    # Given a child that ignores SIGTERM
    child = python_child(
        tmp_path,
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
        "print('ready', flush=True); time.sleep(60)",
        stop_timeout_s=1.0,
    )
    child.start()
    wait_for("the child ready", lambda: "ready" in (tmp_path / "child.log").read_text())
    # When it is stopped
    started = time.monotonic()
    child.stop()
    # Then it is gone, soon after the timeout
    assert child.pid is not None and not alive(child.pid)
    assert time.monotonic() - started < 5


def test_stopping_a_child_also_stops_what_it_started(tmp_path: Path) -> None:
    # Given a child that starts a grandchild which ignores SIGTERM (as a JVM may linger)
    pid_file = tmp_path / "grandchild.pid"
    child = python_child(
        tmp_path,
        "import subprocess, sys, time;"
        "p = subprocess.Popen([sys.executable, '-c', 'import signal, time;"
        " signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)']);"
        f"open({str(pid_file)!r}, 'w').write(str(p.pid)); time.sleep(60)",
        stop_timeout_s=1.0,
    )
    child.start()
    wait_for("the pid file", lambda: pid_file.exists() and pid_file.read_text() != "")
    grandchild = int(pid_file.read_text())
    # When the child is stopped
    child.stop()
    # Then the grandchild is gone too
    wait_for("the grandchild gone", lambda: not alive(grandchild), timeout_s=5)


def test_a_child_signalled_alone_stops_what_it_started_itself_then_the_rest_is_killed(
    tmp_path: Path,
) -> None:
    # Given a child that, when told to stop, first checks on a grandchild (as the ingest job
    # stops Spark's JVM), and a grandchild that notes a SIGTERM of its own
    noted = tmp_path / "grandchild-signalled"
    seen = tmp_path / "seen-by-child"
    pid_file = tmp_path / "grandchild.pid"
    grandchild_code = (
        "import signal, sys, time;"
        f"signal.signal(signal.SIGTERM, lambda *a: (open({str(noted)!r}, 'w').close(), "
        "sys.exit(0)));"
        "time.sleep(60)"
    )
    child_code = "\n".join(
        (
            "import os, signal, subprocess, sys, time",
            f"p = subprocess.Popen([sys.executable, '-c', {grandchild_code!r}])",
            f"open({str(pid_file)!r}, 'w').write(str(p.pid))",
            "def stop(*a):",
            "    time.sleep(0.5)",
            f"    ran = 'signalled' if os.path.exists({str(noted)!r}) else 'running'",
            f"    open({str(seen)!r}, 'w').write(ran)",
            "    sys.exit(0)",
            "signal.signal(signal.SIGTERM, stop)",
            "time.sleep(60)",
        )
    )
    child = python_child(
        tmp_path,
        child_code,
        stop_timeout_s=3.0,
        signal_leader_only=True,
    )
    child.start()
    wait_for("the pid file", lambda: pid_file.exists() and pid_file.read_text() != "")
    grandchild = int(pid_file.read_text())
    # When the child is stopped
    child.stop()
    # Then only the child got the stop signal: the grandchild still ran while it stopped
    assert seen.read_text() == "running"
    # And what it left behind is gone once it ended
    wait_for("the grandchild gone", lambda: not alive(grandchild), timeout_s=5)


def test_the_output_of_a_child_goes_to_its_log(tmp_path: Path) -> None:
    child = python_child(tmp_path, "import sys; print('out'); print('err', file=sys.stderr)")
    child.start()
    wait_for("the child to exit", lambda: child.exit_code() is not None, 10)
    assert child.log_tail(2).splitlines() == ["out", "err"]


def test_a_child_that_dies_is_restarted_and_reported(tmp_path: Path) -> None:
    # Given a supervised child that exits at once
    reports: list[str] = []
    counter = tmp_path / "runs"
    child = python_child(tmp_path, f"open({str(counter)!r}, 'a').write('x'); raise SystemExit(1)")
    supervisor = Supervisor(reports.append)
    child.start()
    supervisor.watch(child)

    # When it is polled for a while
    def restarted() -> bool:
        supervisor.poll()
        return counter.exists() and len(counter.read_text()) >= 2

    wait_for("the restart", restarted, timeout_s=10)
    # Then it was started again, and its exit was reported with the code
    assert any("exited with code 1" in line for line in reports)


def test_a_child_whose_module_is_missing_is_not_restarted(tmp_path: Path) -> None:
    # Given a supervised child that exits the way `setu` does when its module is missing
    reports: list[str] = []
    child = python_child(tmp_path, f"raise SystemExit({EXIT_NOT_AVAILABLE})")
    supervisor = Supervisor(reports.append)
    child.start()
    supervisor.watch(child)
    wait_for("the child to exit", lambda: child.exit_code() is not None, 10)
    # When it is polled past the first restart delay
    supervisor.poll()
    time.sleep(restart_delay(1) + 0.5)
    supervisor.poll()
    # Then it was reported once, as not installed, and never started again
    assert len(reports) == 1
    assert "not installed" in reports[0]
    assert (tmp_path / "child.log").read_text().count("starting child") == 1
