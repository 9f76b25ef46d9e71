"""Cursors of a shared main partition (delivery/cursors.py, decision 0011): whatever the
readers and the subscriptions do, each subscription takes every record from where it starts
(or was sought to), once, in order; a subscription without room never holds the others."""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from delivery.cursors import PartitionCursors, Reader


@dataclass
class Partition:
    """A main partition that grows, and whose oldest records retention may delete, read by a
    live and a catch-up reader as the real ones read Kafka: in order, each from its own
    position, from the first record still there when that position was deleted."""

    cursors: PartitionCursors
    log: list[int] = field(default_factory=list)  # offsets still held
    produced: int = 0  # the next offset
    deleted: set[int] = field(default_factory=set)
    live: int = 0  # index in log of the live reader's next record
    catch_up: int = 0
    turn: object = None
    taken: dict[str, list[int]] = field(default_factory=dict)

    def produce(self) -> None:
        self.log.append(self.produced)
        self.produced += 1

    def retain(self, records: int) -> None:
        """Retention deletes the oldest ``records`` records."""
        gone = self.log[:records]
        self.deleted.update(gone)
        self.log = self.log[records:]
        self.live = max(0, self.live - len(gone))
        self.catch_up = max(0, self.catch_up - len(gone))

    def end(self) -> int:
        return self.produced

    def first(self) -> int:
        return self.log[0] if self.log else self.produced

    def index_of(self, offset: int) -> int:
        return next((i for i, o in enumerate(self.log) if o >= offset), len(self.log))

    def start_live(self) -> None:
        start = self.cursors.live_start()
        self.live = self.index_of(start if start is not None else self.end())

    def step_live(self) -> None:
        if self.live < len(self.log):
            offset = self.log[self.live]
            self.live += 1
            for name in self.cursors.offer_live(offset):
                self.taken[name].append(offset)

    def step_catch_up(self) -> None:
        if self.cursors.asking_first:
            self.cursors.learned_first(self.first())  # the hub asked Kafka
        turn = self.cursors.turn()
        if turn is None:
            return
        if turn is not self.turn:
            self.turn, self.catch_up = turn, self.index_of(turn.offset)
        if self.catch_up < len(self.log):
            offset = self.log[self.catch_up]
            self.catch_up += 1
            for name in self.cursors.offer_catch_up(offset):
                self.taken[name].append(offset)
        else:
            self.cursors.caught_up(self.end())

    def stale_catch_up(self, index: int, end: bool) -> None:
        """The catch-up reader offers the record at ``index`` of the log (or that place's
        end), which its current turn did not ask for."""
        if not self.log:
            return
        offset = self.log[index % len(self.log)]
        if end:
            self.cursors.caught_up(offset)
            return
        for name in self.cursors.offer_catch_up(offset):
            self.taken[name].append(offset)

    def drain(self) -> None:
        for name in self.cursors.subscriptions():
            self.cursors.set_room(name, True)
        for _ in range(20 * (len(self.log) + 1) * (len(self.taken) + 1)):
            self.step_live()
            self.step_catch_up()


def segments_hold(part: Partition, name: str, starts: list[tuple[int, int]]) -> None:
    """What ``name`` took: for each (index in its takes, offset) it was started or sought at,
    every record produced from that offset on, in order, up to its next seek, but for
    records retention deleted (which it may have taken before they went, or not)."""
    taken = part.taken[name]
    bounds = [*(i for i, _ in starts[1:]), len(taken)]
    for (first, offset), last in zip(starts, bounds, strict=True):
        got = taken[first:last]
        assert got == sorted(set(got)), (name, offset, got)
        if not got:
            continue
        want = range(offset, got[-1] + 1)
        missed = [o for o in want if o not in got]
        assert all(o in part.deleted for o in missed), (name, offset, got, missed)
        assert all(o >= offset for o in got), (name, offset, got)
    # After the drain it has read to the end of the log.
    last_offset = starts[-1][1]
    assert [o for o in part.log if o >= last_offset] == [
        o for o in taken[starts[-1][0] :] if o in part.log
    ]


def test_every_subscription_at_the_same_place_takes_from_the_live_reader() -> None:
    part = Partition(PartitionCursors())
    for n in range(3):
        part.produce()
        del n
    for name in ("a", "b"):
        part.cursors.add(name, 0)
        part.taken[name] = []
    part.start_live()
    for _ in range(3):
        part.step_live()
    assert part.taken == {"a": [0, 1, 2], "b": [0, 1, 2]}
    assert part.cursors.turn() is None


def test_a_subscription_without_room_falls_behind_without_holding_the_others() -> None:
    part = Partition(PartitionCursors(turn_records=2))
    for name in ("fast", "slow"):
        part.cursors.add(name, 0)
        part.taken[name] = []
    part.start_live()
    part.cursors.set_room("slow", False)
    for _ in range(10):
        part.produce()
        part.step_live()
        part.step_catch_up()  # nothing to catch up: the slow one has no room
    assert part.taken["fast"] == list(range(10))
    assert part.taken["slow"] == []
    assert part.cursors.follows("slow") is Reader.CATCH_UP
    part.cursors.set_room("slow", True)
    part.produce()
    part.step_live()  # the live reader goes on for the fast one meanwhile
    while part.cursors.follows("slow") is Reader.CATCH_UP:
        part.step_catch_up()
    assert part.taken["slow"] == list(range(11))
    part.produce()
    part.step_live()
    assert part.taken["fast"] == part.taken["slow"] == list(range(12))


def partition_of(records: int, starts: dict[str, int], turn_records: int) -> Partition:
    """A partition of ``records`` records with a cursor per name in ``starts``, live reader
    started."""
    part = Partition(PartitionCursors(turn_records=turn_records))
    for _ in range(records):
        part.produce()
    for name, start in starts.items():
        part.cursors.add(name, start)
        part.taken[name] = []
    part.start_live()
    return part


def test_behind_cursors_at_different_places_are_served_in_turns() -> None:
    part = partition_of(30, {"far": 0, "near": 20, "live": 30}, turn_records=3)
    for _ in range(6):
        part.step_catch_up()
    # Two turns of three: one each, the far one not read to the end before the near one began.
    assert part.taken["far"] == [0, 1, 2]
    assert part.taken["near"] == [20, 21, 22]


def test_cursors_a_few_records_apart_are_caught_up_in_one_pass() -> None:
    # Given ten cursors two records apart behind the live reader (subscriptions taken over
    # at once, each from its own committed offset)
    starts = {f"s{n}": 2 * n for n in range(10)}
    part = partition_of(30, {**starts, "live": 30}, turn_records=100)
    # When the catch-up reader reads
    turns = []
    while any(part.cursors.follows(name) is Reader.CATCH_UP for name in starts):
        turn = part.cursors.turn()
        if turn is not None and (not turns or turns[-1] is not turn):
            turns.append(turn)
        part.step_catch_up()
    # Then one turn served them all, each from its own place
    assert len(turns) == 1
    assert all(part.taken[name] == list(range(start, 30)) for name, start in starts.items())


def test_a_sought_cursor_reads_on_from_its_new_place() -> None:
    part = Partition(PartitionCursors())
    for n in range(10):
        part.produce()
        del n
    part.cursors.add("a", 0)
    part.taken["a"] = []
    part.start_live()
    for _ in range(10):
        part.step_live()
    part.cursors.seek("a", 4)
    part.drain()
    assert part.taken["a"] == [*range(10), *range(4, 10)]


actions = st.lists(
    st.one_of(
        st.tuples(st.just("produce"), st.integers(0, 2)),
        # Retention deletes the oldest records
        st.tuples(st.just("retain"), st.integers(1, 3)),
        st.tuples(st.just("live"), st.integers(1, 4)),
        st.tuples(st.just("catch_up"), st.integers(1, 4)),
        st.tuples(st.just("room"), st.integers(0, 3), st.booleans()),
        st.tuples(st.just("seek"), st.integers(0, 3), st.integers(0, 40)),
        # A runner started again: its cursor is added anew under the same name
        st.tuples(st.just("add"), st.integers(0, 3), st.integers(0, 40)),
        # The catch-up reader hands over a record, or an end, from where it was before its
        # latest seek took (what a client may still deliver right after a seek)
        st.tuples(st.just("stale"), st.integers(0, 60), st.booleans()),
    ),
    max_size=120,
)


def play(
    part: Partition,
    names: list[str],
    marks: dict[str, list[tuple[int, int]]],
    step: tuple[object, ...],
) -> None:
    """One step of the property test below; a seek or a new start is marked in ``marks``."""
    kind = step[0]
    if kind == "produce":
        for _ in range(int(str(step[1])) + 1):
            part.produce()
    elif kind == "retain":
        part.retain(int(str(step[1])))
    elif kind == "live":
        for _ in range(int(str(step[1]))):
            part.step_live()
    elif kind == "catch_up":
        for _ in range(int(str(step[1]))):
            part.step_catch_up()
    elif kind == "room":
        part.cursors.set_room(names[int(str(step[1])) % len(names)], bool(step[2]))
    elif kind == "stale":
        part.stale_catch_up(int(str(step[1])), end=bool(step[2]))
    elif kind in ("seek", "add"):
        name, offset = names[int(str(step[1])) % len(names)], int(str(step[2]))
        if kind == "seek":
            part.cursors.seek(name, offset)
        else:
            part.cursors.add(name, offset)
        marks[name].append((len(part.taken[name]), offset))


@settings(max_examples=300, deadline=None)
@given(
    starts=st.lists(st.integers(0, 12), min_size=1, max_size=4),
    initial=st.integers(0, 12),
    turn_records=st.integers(1, 5),
    steps=actions,
)
def test_every_subscription_takes_each_record_once_in_order(
    starts: list[int], initial: int, turn_records: int, steps: list[tuple[object, ...]]
) -> None:
    part = Partition(PartitionCursors(turn_records=turn_records))
    for _ in range(initial):
        part.produce()
    names = [f"s{i}" for i in range(len(starts))]
    marks: dict[str, list[tuple[int, int]]] = {}
    for name, start in zip(names, starts, strict=True):
        part.cursors.add(name, start)
        part.taken[name] = []
        marks[name] = [(0, start)]
    part.start_live()
    for step in steps:
        play(part, names, marks, step)
    part.drain()
    for name in names:
        segments_hold(part, name, marks[name])


def test_a_rider_that_missed_a_record_of_its_turn_waits_for_a_turn_of_its_own() -> None:
    part = Partition(PartitionCursors(turn_records=100))
    for n in range(10):
        part.produce()
        del n
    part.cursors.add("a", 0)
    part.cursors.add("b", 0)
    for name in ("c", "d", "e"):
        part.cursors.add(name, 10)  # most cursors: the live reader starts there
    for name in ("a", "b", "c", "d", "e"):
        part.taken[name] = []
    part.start_live()
    assert part.cursors.follows("a") is Reader.CATCH_UP
    part.step_catch_up()
    part.cursors.set_room("a", False)
    part.step_catch_up()  # offset 1: b takes it, a has no room
    part.cursors.set_room("a", True)
    part.drain()
    assert part.taken["a"] == part.taken["b"] == list(range(10))


def test_a_cursor_added_again_behind_its_turn_takes_every_record_from_its_new_start() -> None:
    # Given a cursor riding a catch-up turn from offset 20 (of 30 records)
    part = partition_of(30, {"a": 20, "live": 30, "also": 30}, turn_records=100)
    part.step_catch_up()
    assert part.taken["a"] == [20]
    # When its runner starts again and adds it anew from offset 0 (its last commit)
    part.cursors.add("a", 0)
    part.taken["a"] = []
    part.drain()
    # Then it takes every record from 0, none skipped for the turn it rode before
    assert part.taken["a"] == list(range(30))


def test_a_record_read_from_before_the_turns_seek_is_not_taken() -> None:
    # Given a cursor behind the live reader at 5, whose catch-up turn just began (the reader
    # was at 20 for another subscription before)
    part = partition_of(30, {"a": 5, "live": 30, "also": 30}, turn_records=100)
    assert part.cursors.turn() is not None
    # When the reader hands over a record from where it was, and then that place's end
    part.stale_catch_up(20, end=False)
    part.stale_catch_up(29, end=True)
    # Then the cursor took neither, and reads everything from 5 on
    assert part.taken["a"] == []
    part.drain()
    assert part.taken["a"] == list(range(5, 30))


def test_records_retention_deleted_are_crossed_and_no_other_gap_is() -> None:
    # Given a log whose offsets 0 to 4 retention deleted, a cursor at 3 and one at 8
    part = partition_of(10, {"a": 3, "b": 8, "live": 10, "also": 10}, turn_records=100)
    part.retain(5)
    # When the reader, sought to 3 for a's turn, hands over a record from where it was
    # before (9): a gap above the first offset, which is not known yet
    assert part.cursors.turn() is not None
    part.stale_catch_up(len(part.log) - 1, end=False)
    # Then nothing is crossed: no turn goes on until the first offset is known
    assert part.taken["a"] == part.taken["b"] == []
    assert part.cursors.turn() is None
    # And once it is, a reads on from the first record still there, and b from its own
    part.drain()
    assert part.taken["a"] == [5, 6, 7, 8, 9]
    assert part.taken["b"] == [8, 9]
