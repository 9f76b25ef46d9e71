"""`setu dev up` end to end: a real broker, Redis and the API, stopped cleanly by Ctrl-C."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Any

import httpx
import redis
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from setu.stream import frames
from tests.integration.support_dev_up import START_TIMEOUT_S, dev_up, stack_ports


def processes_mentioning(marker: str) -> list[str]:
    """Command lines of live processes whose command line or environment contains ``marker``."""
    found = []
    me = os.getpid()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == me:
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
            environ = (proc / "environ").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline or marker.encode() in environ:
            found.append(cmdline.replace(b"\0", b" ").decode(errors="replace"))
    return found


def await_text(url: str, timeout_s: float = 120) -> str:
    """The body of ``url`` once it answers 200 (the ingest job starts Spark first)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            response = httpx.get(url, timeout=5)
            if response.status_code == 200:
                return response.text
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, f"{url} never answered 200"
        time.sleep(0.5)


def hello(address: str, key: str) -> frames.Frame:
    """The streaming listener's answer to a HELLO with ``key`` as cookie."""
    host, _, port = address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=10) as connection:
        connection.sendall(frames.encode(frames.Hello(b"3", key.encode(), b"test", b"dev-up")))
        cutter = frames.FrameReader()
        while True:
            data = connection.recv(65536)
            assert data, "the listener closed the connection"
            for frame in cutter.feed(data):
                return frame


def await_health(url: str) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(await_text(url, 60))
    return body


def test_dev_up_runs_the_stack_and_stops_it_all_on_ctrl_c(tmp_path: Path) -> None:
    # Given ports nobody else uses (a shared broker may hold 9092/9093 on this machine)
    data_dir = tmp_path / "setu-data"
    ports = stack_ports()

    # When the stack is brought up
    with dev_up(data_dir, ports) as stack:
        stack.wait_for_line(r"setu dev up: ready", START_TIMEOUT_S)
        api = stack.wait_for_line(r"API\s+(http://\S+)", 5).group(1)
        ingest_metrics = stack.wait_for_line(r"ingest (http://\S+/metrics)", 5).group(1)
        streaming = stack.wait_for_line(r"Streaming (\S+)", 5).group(1)
        # Ready means the ingest query runs already: a first message does not wait for Spark
        assert stack.wait_for_line(r"Ingest\s+(\S+)", 5).group(1) == "running"
        kafka = stack.wait_for_line(r"Kafka\s+(\S+)", 5).group(1)
        redis_url = stack.wait_for_line(r"Redis\s+(\S+)", 5).group(1)
        exported = stack.wait_for_line(r"export SETU_API_URL=(\S+)", 5).group(1)
        key = stack.wait_for_line(r"export SETU_API_KEY=(\S+)", 5).group(1)

        # Then the API, the broker and Redis answer where it says, on the ports asked for
        assert api == exported == f"http://127.0.0.1:{ports['api']}"
        assert kafka == f"127.0.0.1:{ports['kafka']}"
        health = await_health(f"{api}/v1/health")
        assert health["status"] == "ok"
        assert {"kafka", "redis", "database"} <= set(health["components"])
        assert health["components"]["ingest"]["state"] == "running"
        # The key it printed is the admin's; without it the API refuses
        projects = httpx.get(f"{api}/v1/projects", headers={"Authorization": f"Bearer {key}"})
        assert projects.status_code == 200
        assert httpx.get(f"{api}/v1/projects").status_code == 401
        # The streaming listener answers a HELLO with that key with OK
        assert streaming == f"127.0.0.1:{ports['stream']}"
        assert isinstance(hello(streaming, key), frames.Ok)
        assert "setu_ingest_query_active" in await_text(ingest_metrics)
        admin = AdminClient({"bootstrap.servers": kafka})
        topic = "setu-dev-up-test"
        admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)])[
            topic
        ].result(timeout=30)
        client = redis.Redis.from_url(redis_url)
        assert client.ping()
        client.set("setu-dev-up-test", b"kept")
        client.close()

        # And Ctrl-C stops everything it started
        assert stack.stop() == 0
        assert stack.seen[-1] == "setu dev up: stopped"
    assert processes_mentioning(str(data_dir)) == []

    # When it is brought up again on the same data dir, with ingest on a local Spark cluster
    with dev_up(data_dir, ports, "--spark-workers", "1") as again:
        again.wait_for_line(r"setu dev up: ready", START_TIMEOUT_S)
        # Then the ingest query runs on the cluster, from the same checkpoint
        master = f"spark://127.0.0.1:{ports['spark']}"
        assert again.wait_for_line(r"Ingest\s+(.+)", 5).group(1) == (
            f"running (on the Spark cluster {master})"
        )
        # and the admin key is the one kept from the first run
        assert again.wait_for_line(r"export SETU_API_KEY=(\S+)", 5).group(1) == key
        # Then the broker kept its topics and Redis its keys (storage is not formatted again)
        metadata = AdminClient({"bootstrap.servers": kafka}).list_topics(timeout=30)
        assert len(metadata.topics[topic].partitions) == 2
        client = redis.Redis.from_url(redis_url)
        assert client.get("setu-dev-up-test") == b"kept"
        client.close()
        assert again.stop() == 0
    assert processes_mentioning(str(data_dir)) == []
    logs = {p.name for p in (data_dir / "logs").iterdir()}
    assert {"kafka.log", "redis.log", "api.log", "migrate.log", "spark-worker-0.log"} <= logs
    # And stopping by Ctrl-C left no traceback in any log: each process stopped as asked
    for log in (data_dir / "logs").iterdir():
        text = log.read_text(errors="replace")
        assert "Traceback" not in text, (
            f"{log.name}:\n{text[max(0, text.index('Traceback') - 2000) :]}"
        )
