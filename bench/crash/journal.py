"""An append-only JSON-lines journal whose appends return only once the line is on disk.

Both witnesses of the crash test (producer and receiver) keep one. Appends are group-committed:
lines queued while an fsync runs are written and synced together, so many concurrent callers
share one fsync, and each caller's ``append`` returns only after its own line is durable.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

Entry = dict[str, Any]


def repair_tail(path: Path) -> None:
    """Cut a torn last line (no trailing newline) left by a kill in the middle of a write.

    Such a line was never reported durable to anyone, so dropping it loses nothing; keeping it
    would glue the next appended line onto it.
    """
    if not path.exists():
        return
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        with path.open("r+b") as handle:
            handle.truncate(data.rfind(b"\n") + 1)


def read_entries(path: Path) -> list[Entry]:
    """Every complete line of the journal, in order; a torn last line is ignored."""
    if not path.exists():
        return []
    return list(parse_lines(path.read_bytes()))


def parse_lines(data: bytes) -> Iterator[Entry]:
    """Parse complete lines; the bytes after the last newline are an unfinished line."""
    for line in data[: data.rfind(b"\n") + 1].splitlines():
        if line:
            yield orjson.loads(line)


class JournalTail:
    """Reads a journal that another process is still appending to, a chunk at a time."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._offset = 0

    def read_new(self) -> list[Entry]:
        """Entries completed since the last call."""
        if not self._path.exists():
            return []
        with self._path.open("rb") as handle:
            handle.seek(self._offset)
            data = handle.read()
        complete = data.rfind(b"\n") + 1
        self._offset += complete
        return list(parse_lines(data[:complete]))


class Journal:
    """An open journal. Use :meth:`open` inside a running event loop, then :meth:`append`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd = -1
        self._queue: asyncio.Queue[tuple[bytes, asyncio.Future[None]]] = asyncio.Queue()
        self._writer: asyncio.Task[None] | None = None

    async def open(self) -> Journal:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        repair_tail(self.path)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._writer = asyncio.create_task(self._write_loop())
        return self

    async def append(self, entry: Entry) -> None:
        """Return once ``entry`` is written and fsynced; raise if the write failed."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        await self._queue.put((orjson.dumps(entry) + b"\n", done))
        await done

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.cancel()
            await asyncio.gather(self._writer, return_exceptions=True)
            self._writer = None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    async def _write_loop(self) -> None:
        while True:
            batch = [await self._queue.get()]
            while not self._queue.empty():
                batch.append(self._queue.get_nowait())
            data = b"".join(line for line, _ in batch)
            try:
                await asyncio.to_thread(self._write_and_sync, data)
            except OSError as error:
                for _, done in batch:
                    if not done.done():
                        done.set_exception(error)
                continue
            for _, done in batch:
                if not done.done():
                    done.set_result(None)

    def _write_and_sync(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            written = os.write(self._fd, view)
            view = view[written:]
        os.fsync(self._fd)
