"""What the streaming tests share: a project with a grouped topic, the listener's address, a
connection speaking frames by hand."""

from __future__ import annotations

import asyncio

from setu.stream import frames
from tests.integration.api.support import ADMIN_KEY, Api, unique


async def new_project(api: Api) -> str:
    """A project with the grouped topic ``t`` of 3 partitions."""
    name = unique()
    assert (await api.client.post("/v1/projects", json={"name": name})).status_code == 201
    created = await api.client.post(
        f"/v1/projects/{name}/topics", json={"name": "t", "grouped": True, "partitions": 3}
    )
    assert created.status_code == 201, created.text
    return name


def address(api: Api) -> str:
    return f"127.0.0.1:{api.app.state.stream.port}"


class Raw:
    """A connection speaking frames by hand, for what a well-behaved client never does."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.cutter = frames.FrameReader()
        self.ready: list[frames.Frame] = []
        self.seen: list[frames.Frame] = []

    @classmethod
    async def open(cls, api: Api, key: str | None = ADMIN_KEY) -> Raw:
        """A connection that says HELLO with ``key`` (None: says nothing)."""
        return await cls.connect(api.app.state.stream.port, key)

    @classmethod
    async def connect(cls, port: int, key: str | None = ADMIN_KEY) -> Raw:
        """:meth:`open` on the listener at ``port`` of this machine."""
        raw = cls(*await asyncio.open_connection("127.0.0.1", port))
        if key is not None:
            raw.send(frames.Hello(b"3", key.encode(), b"tests", b"raw"))
        return raw

    def send(self, *sent: frames.Frame) -> None:
        self.writer.write(b"".join(frames.encode(f) for f in sent))

    async def next(self) -> frames.Frame:
        """The next frame; ConnectionError when the server closed the connection."""
        while not self.ready:
            data = await asyncio.wait_for(self.reader.read(65536), 15)
            if not data:
                raise ConnectionError("closed")
            self.ready.extend(self.cutter.feed(data))
        frame = self.ready.pop(0)
        self.seen.append(frame)
        return frame

    async def until(self, kind: type[frames.Frame]) -> frames.Frame:
        while not isinstance(frame := await self.next(), kind):
            pass
        return frame

    async def closed(self) -> bool:
        """True once the server closed the connection (frames before that are skipped)."""
        try:
            while True:
                await self.next()
        except ConnectionError:
            return True

    def close(self) -> None:
        self.writer.close()


def message(sequence: int, group: str | None = "g", body: bytes = b"x") -> frames.Message:
    key = None if group is None else group.encode()
    return frames.Message(1, frames.KEY if key is not None else 0, sequence, None, key, body)
