"""The de-duplication marks of each ingest partition, versioned by batch, as the Python
micro-batch job of earlier versions kept them in its checkpoint: read when the JVM operator takes
over from that checkpoint (:mod:`spark.migration`, decision 0008 "Migration").

One folder per ingest partition, ``{checkpoint}/dedup/{ingest topic}/{partition}/``, holding
one file per batch that changed its marks: ``{batch id}.json`` (:func:`spark.dedup.encode_marks`).
The task that de-duplicated a partition in batch N read the newest version *below* N and wrote
version N, so the marks of the committed batches are the newest version at or below the last
committed batch. A version above it is what a batch that was never committed left.

The files live wherever the checkpoint does: ``pyarrow.fs`` reaches a local folder as well as
HDFS or an object store.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from pyarrow import fs as pafs

FOLDER = "dedup"
SUFFIX = ".json"
# Versions kept below the newest: a batch that runs again needs the one below its own.
KEEP_OLDER = 2


@dataclass(frozen=True, slots=True)
class Loaded:
    """The base a batch starts from: its version (None: no marks yet) and the encoded marks."""

    version: int | None
    text: str | None


def checkpoint_fs(checkpoint: str) -> tuple[Any, str]:
    """The file system of a checkpoint URI (a local path, ``file:``, HDFS, an object store)
    and the checkpoint's path on it."""
    if "://" in checkpoint and not checkpoint.startswith("file:"):
        fs, path = pafs.FileSystem.from_uri(checkpoint)
        return fs, str(path)
    return pafs.LocalFileSystem(), checkpoint.removeprefix("file://").removeprefix("file:")


class PartitionMarks:
    """The versioned marks of every ingest partition under one checkpoint. Picklable: only the
    checkpoint's URI travels to the executors, which open the file system themselves."""

    def __init__(self, checkpoint: str) -> None:
        self.checkpoint = checkpoint.rstrip("/")
        self._fs: Any = None
        self._root = ""

    def __getstate__(self) -> dict[str, Any]:
        return {"checkpoint": self.checkpoint}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["checkpoint"])  # type: ignore[misc]

    def _open(self) -> tuple[Any, str]:
        if self._fs is None:
            self._fs, path = checkpoint_fs(self.checkpoint)
            self._root = f"{path}/{FOLDER}"
        return self._fs, self._root

    def folder(self, topic: str, partition: int) -> str:
        _, root = self._open()
        return f"{root}/{topic}/{partition}"

    def versions(self, topic: str, partition: int) -> list[int]:
        """The versions stored for the partition, oldest first."""
        fs, _ = self._open()
        selector = pafs.FileSelector(self.folder(topic, partition), allow_not_found=True)
        found = []
        for info in fs.get_file_info(selector):
            name = info.base_name
            if name.endswith(SUFFIX) and name[: -len(SUFFIX)].isdigit():
                found.append(int(name[: -len(SUFFIX)]))
        return sorted(found)

    def load(self, topic: str, partition: int, batch: int) -> Loaded:
        """The newest marks stored below ``batch``."""
        below = [v for v in self.versions(topic, partition) if v < batch]
        if not below:
            return Loaded(None, None)
        fs, _ = self._open()
        path = f"{self.folder(topic, partition)}/{below[-1]}{SUFFIX}"
        with fs.open_input_stream(path) as stream:
            return Loaded(below[-1], stream.read().decode())

    def all_below(self, batch: int) -> list[str]:
        """The newest marks stored below ``batch`` of every partition of every ingest topic
        (encoded): everything committed batches decided, for publishing again when Redis
        forgot the producer marks (spark/marks.py)."""
        return [text for _, _, text in self.partitions_below(batch)]

    def partitions_below(self, batch: int) -> list[tuple[str, int, str]]:
        """Per partition of every ingest topic with marks below ``batch``: (ingest topic,
        partition, its newest marks below ``batch``, encoded)."""
        fs, root = self._open()
        found = []
        for topic in fs.get_file_info(pafs.FileSelector(root, allow_not_found=True)):
            if topic.type != pafs.FileType.Directory:
                continue
            selector = pafs.FileSelector(topic.path, allow_not_found=True)
            for partition in fs.get_file_info(selector):
                if partition.type == pafs.FileType.Directory and partition.base_name.isdigit():
                    number = int(partition.base_name)
                    loaded = self.load(topic.base_name, number, batch)
                    if loaded.text is not None:
                        found.append((topic.base_name, number, loaded.text))
        return found

    def save(self, topic: str, partition: int, batch: int, text: str) -> None:
        """Stores ``text`` as the partition's version ``batch`` and forgets versions older
        than the ``KEEP_OLDER`` below it."""
        fs, _ = self._open()
        folder = self.folder(topic, partition)
        fs.create_dir(folder, recursive=True)
        temporary = f"{folder}/.{batch}.{uuid.uuid4().hex}.tmp"
        with fs.open_output_stream(temporary) as stream:
            stream.write(text.encode())
        fs.move(temporary, f"{folder}/{batch}{SUFFIX}")
        older = [v for v in self.versions(topic, partition) if v < batch]
        for version in older[: max(0, len(older) - KEEP_OLDER)]:
            fs.delete_file(f"{folder}/{version}{SUFFIX}")
