"""TCP keepalive for streaming connections, on both ends (docs/streaming.md, "Idle sessions").

A peer gone without a FIN (a pulled cable, a NAT that forgot the flow, a host that died) is
found by keepalive probes within about 10 + 3 x 5 s, and data sent to it that stays
unacknowledged for ``user_timeout_s`` ends the connection: neither end waits on it for ever.
"""

from __future__ import annotations

import contextlib
import socket

KEEPALIVE_IDLE_S, KEEPALIVE_INTERVAL_S, KEEPALIVE_PROBES = 10, 5, 3


def keep_alive(sock: socket.socket, user_timeout_s: float) -> None:
    """Keepalive probes on ``sock`` and TCP_USER_TIMEOUT, where the OS has them."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        if hasattr(socket, "TCP_KEEPIDLE"):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, KEEPALIVE_IDLE_S)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, KEEPALIVE_INTERVAL_S)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, KEEPALIVE_PROBES)
        if hasattr(socket, "TCP_USER_TIMEOUT"):
            timeout_ms = max(1000, round(user_timeout_s * 1000))
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, timeout_ms)
