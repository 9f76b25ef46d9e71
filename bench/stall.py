"""What the delivery-stall benchmarks share (``bench.redis_forgets``, ``bench.broker_wipe``):
a webhook that journals every call, one grouped subscription served by a ``setu deliver``
worker (``bench.delivery``'s worker mode) whose group P is parked behind a 400, and the
figures of waits and gaps."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from setu import names
from setu.model import Endpoint, RetryPolicy, Subscription, Topic
from state.kafka_admin import KafkaTopics

PARTITIONS = 2
DELAYS_MS = (300, 600)
PARKED = "P"


class Calls:
    """Every call the webhook got: (time, group, message id, status). Group P gets 400."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.rows: list[tuple[float, str, str, int]] = []

    def handler(self) -> type[BaseHTTPRequestHandler]:
        calls = self

        class Hook(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("content-length", "0")))
                group = self.headers.get("x_group_id", "")
                status = 400 if group == PARKED else 200
                with calls.lock:
                    calls.rows.append(
                        (time.monotonic(), group, self.headers.get("x_message_id", ""), status)
                    )
                self.send_response(status)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Hook

    def first_2xx(self) -> dict[str, float]:
        with self.lock:
            out: dict[str, float] = {}
            for at, _, message_id, status in self.rows:
                if 200 <= status < 300 and message_id not in out:
                    out[message_id] = at
            return out


@dataclass
class Served:
    """A subscription being delivered: its project, main log, webhook and worker."""

    project: str
    main: str
    calls: Calls
    server: ThreadingHTTPServer
    worker: subprocess.Popen[bytes]

    def stop(self) -> None:
        self.worker.terminate()
        self.worker.wait(60)
        self.server.shutdown()


def serve_subscription(
    prefix: str, bootstrap: str, redis_url: str, replication_factor: int = 1
) -> Served:
    """Creates a grouped topic and subscription (new project ``prefix…``), the webhook and
    the worker."""
    project = f"{prefix}{uuid.uuid4().hex[:8]}"
    topics = KafkaTopics(bootstrap, replication_factor=replication_factor)
    topic = Topic(project, "t", grouped=True, partitions=PARTITIONS, retention_hours=1)
    topics.ensure_topic(topic)
    sub = Subscription(
        project, "s", "t", Endpoint("http://x/"), grouped=True, retry=RetryPolicy(DELAYS_MS)
    )
    topics.ensure_subscription(sub, topic)
    calls = Calls()
    server = ThreadingHTTPServer(("127.0.0.1", 0), calls.handler())
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    config = {
        "project": project,
        "subscription": "s",
        "topic": "t",
        "grouped": True,
        "url": f"http://127.0.0.1:{server.server_address[1]}/hook",
        "bootstrap": bootstrap,
        "redis": redis_url,
        "max_in_flight": 256,
        "delays_ms": list(DELAYS_MS),
        "attempt_log_hours": 24,
        "replication_factor": replication_factor,
    }
    worker = subprocess.Popen(
        [sys.executable, "-m", "bench.delivery", "--serve-worker", json.dumps(config)]
    )
    return Served(project, names.main_topic(project, "t"), calls, server, worker)


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))] if ordered else 0.0


def summary(waits: list[float]) -> dict[str, float]:
    """p50, p99 and max of ``waits`` (seconds) in ms, and how many."""
    return {
        "p50_ms": round(percentile(waits, 0.5) * 1000, 1),
        "p99_ms": round(percentile(waits, 0.99) * 1000, 1),
        "max_ms": round(max(waits, default=0.0) * 1000, 1),
        "messages": len(waits),
    }


def wait(what: str, condition: Callable[[], object], timeout_s: float) -> float:
    """Waits for ``condition``; returns when it held (monotonic), raises after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.02)
    return time.monotonic()
