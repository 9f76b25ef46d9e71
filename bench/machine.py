"""What every benchmark states about where it ran, and the helpers they share to run honestly:
their own servers on free ports, and figures kept apart from client libraries' log noise."""

from __future__ import annotations

import json
import logging
import os
import platform
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def machine() -> dict[str, Any]:
    """Cores, load average (1, 5, 15 min) and versions, as the JSON of a result states them."""
    return {
        "cores": os.cpu_count(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "platform": platform.platform(),
        "python": platform.python_version(),
    }


class ServerDidNotStart(SystemExit):
    """A benchmark's own server exited or stayed silent: nothing may be measured."""


def wait_for_own_server(
    process: subprocess.Popen[Any], name: str, answers: Callable[[], bool], timeout_s: float
) -> None:
    """Waits until ``answers()`` is true while ``process`` (the benchmark's own server) is alive.

    Stops the benchmark with an error if the process exits first (a taken port, say) or never
    answers: an answer while the process is dead would come from some other server.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise ServerDidNotStart(f"{name} exited with code {process.returncode} during startup")
        try:
            if answers():
                if process.poll() is not None:
                    raise ServerDidNotStart(f"{name} exited during startup")
                return
        except OSError:
            pass
        time.sleep(0.2)
    process.terminate()
    raise ServerDidNotStart(f"{name} did not answer within {timeout_s:.0f} s")


def quiet_client_logs() -> None:
    """Keeps librdkafka's and py4j's chatter out of the printed figures (they log at WARNING
    and INFO on stderr while brokers and Spark start and stop)."""
    for name in ("py4j", "py4j.clientserver", "confluent_kafka", "kafka"):
        logging.getLogger(name).setLevel(logging.ERROR)


def quiet_kafka_config() -> dict[str, Any]:
    """A confluent-kafka client setting that sends librdkafka's logs to a silent logger."""
    silent = logging.getLogger("bench.librdkafka")
    if not silent.handlers:
        silent.addHandler(logging.NullHandler())
        silent.propagate = False
    return {"logger": silent}


def write_result(name: str, figures: dict[str, Any], suffix: str = "") -> Path:
    """Writes ``figures`` (with the machine) to ``bench/results/<name>-<time><suffix>.json``."""
    RESULTS.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = RESULTS / f"{name}-{stamp}{suffix}.json"
    path.write_text(json.dumps({"machine": machine(), **figures}, indent=2) + "\n")
    return path


class OtlpSink:
    """A local OTLP/HTTP endpoint that takes every export and counts its bytes: what a
    benchmark points ``OTEL_EXPORTER_OTLP_ENDPOINT`` at to measure tracing's cost (and to
    prove spans were really sent)."""

    def __init__(self) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        sink = self
        self.exports = 0
        self.bytes = 0
        self.received = threading.Event()

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                sink.bytes += len(self.rfile.read(length))
                sink.exports += 1
                sink.received.set()
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def env(self) -> dict[str, str]:
        """The variables that turn a Setu process's tracing on, towards this sink."""
        return {"OTEL_EXPORTER_OTLP_ENDPOINT": self.endpoint}

    def close(self) -> None:
        self._server.shutdown()


def service_arguments(parser: Any) -> None:
    """The options every benchmark shares: the broker and Redis to use (default: the
    ``SETU_KAFKA_BOOTSTRAP`` / ``SETU_REDIS_URL`` of the environment, else the usual local
    ports), and a label for the result file's name."""
    parser.add_argument(
        "--bootstrap", default=os.environ.get("SETU_KAFKA_BOOTSTRAP", "127.0.0.1:9092")
    )
    parser.add_argument(
        "--redis", default=os.environ.get("SETU_REDIS_URL", "redis://127.0.0.1:6379/0")
    )
    parser.add_argument("--label", default="", help="a suffix for the result file's name")


def process_tree(pid: int) -> dict[int, list[str]]:
    """Each process of ``pid``'s tree (itself and every descendant): pid -> its
    ``/proc/<pid>/stat`` fields after the command name (field 3 of proc(5) is index 0)."""
    parents: dict[int, int] = {}
    stats: dict[int, list[str]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(entry.name)] = int(fields[1])
        stats[int(entry.name)] = fields
    tree, frontier = {pid}, [pid]
    while frontier:
        parent = frontier.pop()
        children = [child for child, p in parents.items() if p == parent and child not in tree]
        tree.update(children)
        frontier.extend(children)
    return {p: stats[p] for p in tree if p in stats}


def footprint(pid: int) -> dict[str, int]:
    """Threads and resident memory (MiB) of ``pid`` with all its descendants (the ingest job's
    JVM, a worker's helpers)."""
    threads, rss_kib = 0, 0
    for member in process_tree(pid):
        try:
            text = Path(f"/proc/{member}/status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
        threads += int(fields.get("Threads", "0").strip())
        rss_kib += int(fields.get("VmRSS", "0 kB").split()[0])
    return {"threads": threads, "rss_mib": rss_kib // 1024}
