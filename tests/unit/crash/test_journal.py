"""The journal: appends are durable when they return; torn tails are cut."""

from __future__ import annotations

import asyncio
from pathlib import Path

from bench.crash.journal import Journal, JournalTail, read_entries, repair_tail


async def test_concurrent_appends_all_land_as_whole_lines(tmp_path: Path) -> None:
    journal = await Journal(tmp_path / "j.log").open()
    await asyncio.gather(*(journal.append({"n": n}) for n in range(200)))
    await journal.close()
    assert sorted(e["n"] for e in read_entries(tmp_path / "j.log")) == list(range(200))


async def test_append_returns_after_the_line_is_in_the_file(tmp_path: Path) -> None:
    journal = await Journal(tmp_path / "j.log").open()
    await journal.append({"n": 1})
    # Read by another handle while the journal is still open: the line is already there.
    assert read_entries(tmp_path / "j.log") == [{"n": 1}]
    await journal.close()


async def test_reopening_after_a_torn_write_drops_only_the_torn_line(tmp_path: Path) -> None:
    path = tmp_path / "j.log"
    path.write_bytes(b'{"n":1}\n{"n":2}\n{"n":')
    assert read_entries(path) == [{"n": 1}, {"n": 2}]
    journal = await Journal(path).open()
    await journal.append({"n": 3})
    await journal.close()
    assert read_entries(path) == [{"n": 1}, {"n": 2}, {"n": 3}]


def test_repair_tail_of_a_file_without_any_newline(tmp_path: Path) -> None:
    path = tmp_path / "j.log"
    path.write_bytes(b'{"n"')
    repair_tail(path)
    assert path.read_bytes() == b""


def test_missing_journal_reads_as_empty(tmp_path: Path) -> None:
    assert read_entries(tmp_path / "none.log") == []
    assert JournalTail(tmp_path / "none.log").read_new() == []


def test_tail_returns_each_complete_line_once(tmp_path: Path) -> None:
    path = tmp_path / "j.log"
    tail = JournalTail(path)
    path.write_bytes(b'{"n":1}\n{"n":')
    assert tail.read_new() == [{"n": 1}]
    with path.open("ab") as handle:
        handle.write(b'2}\n{"n":3}\n')
    assert tail.read_new() == [{"n": 2}, {"n": 3}]
    assert tail.read_new() == []
