"""Choosing loopback ports for local services.

The choice is a pure function over "is this port free?" so it can be tested with a table;
the probes that answer that question bind real sockets.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from pathlib import Path

LOOPBACK = "127.0.0.1"


class PortBusy(Exception):
    """Raised when a port that was asked for explicitly is already taken."""


def choose_port(
    explicit: int | None,
    remembered: int | None,
    default: int | None,
    is_free: Callable[[int], bool],
) -> int | None:
    """The port to listen on, or None to let the operating system pick one.

    An explicit port is taken as is, or refused with PortBusy. Otherwise the port used last
    time wins (so URLs stay stable between runs), then the service's usual port.
    """
    if explicit is not None:
        if not is_free(explicit):
            raise PortBusy(f"port {explicit} is already in use")
        return explicit
    for candidate in (remembered, default):
        if candidate is not None and is_free(candidate):
            return candidate
    return None


def is_free(port: int, host: str = LOOPBACK) -> bool:
    """True when nothing listens on ``host:port`` (connections in TIME_WAIT do not count)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
        return True


def any_free_port(host: str = LOOPBACK) -> int:
    """A port the operating system considers free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        port: int = probe.getsockname()[1]
        return port


def free_ports(count: int, ask: Callable[[], int] = any_free_port) -> list[int]:
    """``count`` ports free right now, all different (the system may hand out one it just
    gave, so ``ask`` is called again until they differ)."""
    ports: list[int] = []
    while len(ports) < count:
        port = ask()
        if port not in ports:
            ports.append(port)
    return ports


def pick(
    explicit: int | None,
    remembered: int | None,
    default: int | None,
    taken: set[int],
) -> int:
    """A free port by :func:`choose_port`, never one in ``taken`` (already given out)."""

    def free(port: int) -> bool:
        return port not in taken and is_free(port)

    port = choose_port(explicit, remembered, default, free)
    while port is None or port in taken:
        port = any_free_port()
    return port


class PortBook:
    """Ports remembered between runs in a small JSON file: name → port."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> dict[str, int]:
        try:
            raw = json.loads(self.path.read_text())
        except (FileNotFoundError, ValueError):
            return {}
        if not isinstance(raw, dict):
            return {}
        return {str(k): v for k, v in raw.items() if isinstance(v, int)}

    def save(self, ports: dict[str, int]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(ports, indent=2, sort_keys=True) + "\n")
