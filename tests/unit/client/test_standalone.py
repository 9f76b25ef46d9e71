"""``setu.client`` installs without the server: importing it pulls in none of the server's
dependencies, only the standard library and Setu's frames."""

from __future__ import annotations

import subprocess
import sys
import textwrap

SERVER_PACKAGES = [
    "confluent_kafka",
    "fastapi",
    "httpx",
    "opentelemetry",
    "orjson",
    "pydantic",
    "pydantic_settings",
    "pyspark",
    "redis",
    "sqlalchemy",
    "starlette",
    "uvicorn",
    "api",
    "delivery",
    "spark",
    "state",
    "cli",
]


def test_the_client_imports_and_runs_without_the_servers_dependencies() -> None:
    script = textwrap.dedent(
        f"""
        import importlib.abc, sys

        class Refuse(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in {SERVER_PACKAGES!r}:
                    raise ImportError(f"the client imported {{name}}")
                return None

        sys.meta_path.insert(0, Refuse())
        from setu.client import AsyncStreamProducer, HttpClient, StreamProducer
        from setu.stream import frames
        HttpClient("http://127.0.0.1:1", "key")
        AsyncStreamProducer("127.0.0.1:1", "key", "p", "t", "producer")
        assert frames.decode(frames.encode(frames.Restart())[4:]) == frames.Restart()
        print("ok")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
