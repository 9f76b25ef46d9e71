"""Finding a local service's process from its port (Linux /proc), to pause or measure it."""

from __future__ import annotations

import os
from pathlib import Path


def listener_pid(port: int) -> int:
    """The process listening on TCP ``port`` on this machine; LookupError if none is."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                inodes.add(f"socket:[{inode}]")
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                if os.readlink(f"/proc/{pid}/fd/{fd}") in inodes:
                    return int(pid)
        except OSError:
            continue  # gone, or not ours to read
    raise LookupError(f"nothing listens on port {port}")


def rss_kib(pid: int | None = None) -> int:
    """Resident memory of a process (this one by default), in KiB."""
    status = Path(f"/proc/{pid or 'self'}/status").read_text()
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise LookupError("no VmRSS")
