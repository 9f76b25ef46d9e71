"""Which network addresses a webhook may reach (docs/security.md §4).

Unless private endpoints are allowed, every address a webhook's host resolves to must be
public. Refused: loopback, private (RFC 1918, unique-local), shared (100.64.0.0/10, where
some clouds keep their metadata service), link-local (169.254.0.0/16, fe80::/10), multicast,
unspecified, reserved, documentation and benchmark ranges: everything Python's ``ipaddress``
does not call global. An IPv6 address that carries an IPv4 one (IPv4-mapped ``::ffff:a.b.c.d``,
IPv4-compatible ``::a.b.c.d``, 6to4 ``2002::/16``, Teredo, NAT64 ``64:ff9b::/96``) is judged by
the IPv4 address it carries, so no spelling of 127.0.0.1 gets through. Decimal, hex and short
IPv4 forms (``2130706433``, ``0x7f.1``) need no rule of their own: the resolver turns them into
the address they name, and that address is what is judged.

Used by the API when a subscription is written and by the delivery client before every new
connection (so a name that later resolves inward, DNS rebinding, is stopped at the call).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Awaitable, Callable

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

Resolver = Callable[[str, int], Awaitable[list[str]]]
"""``(host, port)`` → the addresses to connect to, in order. Injectable, so tests can play a
DNS server that answers differently each time (rebinding)."""


async def system_resolver(host: str, port: int) -> list[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


_NAT64 = (ipaddress.ip_network("64:ff9b::/96"), ipaddress.ip_network("64:ff9b:1::/48"))
LOCAL_NAMES = ("localhost", "localhost.localdomain")


def carried_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address carries (see the module doc), if any."""
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]
    if any(address in net for net in _NAT64) or 1 < int(address) < 2**32:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def is_private_address(address: IPAddress) -> bool:
    """Whether a webhook may not reach ``address`` (see the module doc)."""
    if isinstance(address, ipaddress.IPv6Address):
        carried = carried_ipv4(address)
        if carried is not None and is_private_address(carried):
            return True
    # Not global covers private, shared, loopback, link-local, reserved and unspecified;
    # multicast ranges count as global there.
    return not address.is_global or address.is_multicast


def literal_host_is_private(host: str) -> bool:
    """Whether ``host`` is, without any DNS lookup, a private or loopback destination."""
    lowered = host.lower().rstrip(".")
    if lowered in LOCAL_NAMES or lowered.endswith(".localhost"):
        return True
    try:
        return is_private_address(ipaddress.ip_address(lowered.split("%", 1)[0]))
    except ValueError:
        return False
