"""The dead-letter use cases over stub ports: an in-memory DLQ and the in-memory group store."""

from __future__ import annotations

from setu.envelope import Envelope
from setu.ordering.dead_letters import Selector
from setu.ordering.groups import Kind
from setu.ordering.records import Record
from setu.ordering.state import EMPTY_COUNTS, GroupState, StateWrite
from setu.ordering.tiers import DLQ
from state.dead_letter_ops import DeadLetterOps
from state.groups_stub import StubGroupStore


class MemoryDlq:
    """One partition's dead letters, read ``budget`` at a time."""

    def __init__(self, records: list[Record]) -> None:
        self.records = records
        self.reads = 0

    async def read(self, partition: int, start: int, budget: int) -> tuple[list[Record], int, bool]:
        self.reads += 1
        if partition != 0:
            return [], start, True
        page = [r for r in self.records if r.offset >= start][:budget]
        position = page[-1].offset + 1 if page else start
        return page, position, position > self.records[-1].offset


def dead(offset: int, message: str, group: str | None, kind: Kind) -> Record:
    return Record(DLQ, offset, Envelope(message, b"", group_id=group, failed_at_ms=5), kind)


async def parked(store: StubGroupStore, group: str, n: int) -> None:
    counts = list(EMPTY_COUNTS)
    counts[DLQ] = n
    state = GroupState(counts=tuple(counts), head=f"{group}1", dlq_from=0, failed_at_ms=5)
    await store.apply(StateWrite(0, group, touches_group=True, state=state))


async def test_browsing_pages_through_live_letters_with_a_cursor() -> None:
    # Given group a parked on three letters and a loose letter, all on partition 0
    store = StubGroupStore()
    await parked(store, "a", 3)
    dlq = MemoryDlq(
        [
            dead(0, "a1", "a", Kind.HEAD),
            dead(1, "u1", None, Kind.DEAD),
            dead(2, "a2", "a", Kind.PARK),
            dead(3, "a3", "a", Kind.PARK),
        ]
    )
    ops = DeadLetterOps(store, dlq, partitions=1)
    # When they are browsed three at a time
    first = await ops.browse(None, 3, None)
    second = await ops.browse(None, 3, first.next_cursor)
    # Then every letter comes once, oldest first, and the second (short) page is the last
    seen = [letter.record.message_id for letter, _ in first.letters + second.letters]
    assert seen == ["a1", "u1", "a2", "a3"]
    assert first.next_cursor is not None
    assert second.next_cursor is None
    # And a group's own view has only its letters, with its state
    only_a = await ops.browse("a", 10, None)
    assert [letter.record.message_id for letter, _ in only_a.letters] == ["a1", "a2", "a3"]
    assert all(state is not None and state.parked == 3 for _, state in only_a.letters)


async def test_releasing_a_group_asks_its_partitions_worker_to_deliver_it_again() -> None:
    store = StubGroupStore()
    await parked(store, "a", 2)
    dlq = MemoryDlq([dead(0, "a1", "a", Kind.HEAD), dead(1, "a2", "a", Kind.PARK)])
    ops = DeadLetterOps(store, dlq, partitions=1)
    # When group a is released
    releases = await ops.release(Selector(group_ids=frozenset({"a"})))
    # Then both its letters are requeued through one request for partition 0
    assert releases.requeued == 2
    assert await store.poll_releases(0) == ({"a"}, set())
