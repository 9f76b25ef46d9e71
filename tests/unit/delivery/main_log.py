"""A main-log partition's records as the Kafka client hands them to the shared readers
(delivery/readers.py), for their unit tests."""

from __future__ import annotations

MAIN = "setu.p.t"


class Record:
    """A main-log record of partition 0 of :data:`MAIN`."""

    def __init__(self, offset: int) -> None:
        self._offset = offset

    def topic(self) -> str:
        return MAIN

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._offset

    def error(self) -> None:
        return None
