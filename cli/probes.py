"""Is it up yet? One probe per dependency, and a deadline-polling wait around them."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Mapping

import httpx
import redis


class NotReady(Exception):
    """Raised when something did not answer before its deadline, or died while we waited."""


class StopRequested(Exception):
    """Raised inside a wait when the user asked everything to stop."""


def wait_until(
    ready: Callable[[], bool],
    what: str,
    timeout_s: float,
    stop: threading.Event,
    died: Callable[[], str | None] = lambda: None,
    interval_s: float = 0.25,
) -> None:
    """Returns once ``ready()`` is true; polls every ``interval_s`` up to ``timeout_s``.

    Raises StopRequested when ``stop`` is set, and NotReady when the deadline passes or
    ``died()`` returns a reason (for instance the process being waited for has exited).
    """
    deadline = time.monotonic() + timeout_s
    while True:
        if stop.is_set():
            raise StopRequested(what)
        reason = died()
        if reason is not None:
            raise NotReady(f"{what}: {reason}")
        if ready():
            return
        if time.monotonic() >= deadline:
            raise NotReady(f"{what} did not answer within {timeout_s:g}s")
        stop.wait(interval_s)


def tcp_open(host: str, port: int) -> bool:
    """True when something accepts connections on ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


def kafka_answers(bootstrap: str, client_config: Mapping[str, str] | None = None) -> bool:
    """True when a broker at ``bootstrap`` returns cluster metadata to a client that connects
    with ``client_config`` (SASL, TLS: docs/security.md §8)."""
    from confluent_kafka.admin import AdminClient

    # Only ask once the port is open: librdkafka logs every refused connection to stderr.
    host, _, port = bootstrap.split(",")[0].rpartition(":")
    if not tcp_open(host, int(port)):
        return False
    admin = AdminClient({"bootstrap.servers": bootstrap, **(client_config or {})})
    try:
        admin.list_topics(timeout=3)
    except Exception:  # KafkaException of any kind means "not yet"
        return False
    finally:
        del admin
    return True


def redis_answers(url: str) -> bool:
    """True when the Redis at ``url`` answers PING."""
    client = redis.Redis.from_url(url, socket_timeout=1.0, socket_connect_timeout=1.0)
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
    finally:
        client.close()


def http_ok(url: str) -> bool:
    """True when GET ``url`` returns a 2xx."""
    try:
        return httpx.get(url, timeout=2.0).is_success
    except httpx.HTTPError:
        return False
