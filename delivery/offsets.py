"""Which offset of one Kafka partition may be committed (docs/design.md §3, "Offsets").

Messages finish out of order (group B's message may finish before group A's earlier one). The
committed offset must never pass a message whose outcome is not yet durable, so the
committable offset is the lowest offset read but not finished, or, when everything read has
finished, the position after the last one read.
"""

from __future__ import annotations

import heapq


class OffsetTracker:
    """Offsets read from one partition and which of them have finished.

    ``read`` may go backwards only after :meth:`rewind` (a seek back); reading an offset that is
    still open is an error, so a message can never be in flight twice.
    """

    __slots__ = ("_done", "_heap", "_open", "position")

    def __init__(self, position: int | None = None) -> None:
        self.position = position
        self._heap: list[int] = []
        self._open: set[int] = set()
        self._done: set[int] = set()

    def read(self, offset: int) -> None:
        if offset in self._open:
            raise ValueError(f"offset {offset} is already open")
        self._open.add(offset)
        if offset in self._done:
            # Read again after a seek back: its old heap entry is still there.
            self._done.discard(offset)
        else:
            heapq.heappush(self._heap, offset)
        if self.position is None or offset >= self.position:
            self.position = offset + 1

    def finish(self, offset: int) -> None:
        if offset not in self._open:
            raise ValueError(f"offset {offset} is not open")
        self._open.discard(offset)
        self._done.add(offset)

    def pass_over(self, offset: int) -> None:
        """The consumer read ``offset`` again while it is still open: only the position moves."""
        if self.position is None or offset >= self.position:
            self.position = offset + 1

    def unread(self, offset: int) -> None:
        """Forget an open offset that will be read again after a seek back to or before it."""
        if self.position is None or offset < self.position:
            raise ValueError(f"offset {offset} is not after the position; rewind first")
        self.finish(offset)

    def is_open(self, offset: int) -> bool:
        return offset in self._open

    def rewind(self, offset: int) -> None:
        """The consumer was seeked to ``offset``: the next read may start there again."""
        self.position = offset

    @property
    def open_count(self) -> int:
        return len(self._open)

    def committable(self) -> int | None:
        """The offset to commit now, or None before anything was read or positioned."""
        heap, done = self._heap, self._done
        while heap and heap[0] in done:
            done.discard(heapq.heappop(heap))
        if heap:
            return heap[0] if self.position is None else min(heap[0], self.position)
        return self.position
