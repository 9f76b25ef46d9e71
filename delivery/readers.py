"""One worker's readers, shared by every subscription it serves (decision 0011).

- The **membership** consumer is in the workers' group (``SETU_DELIVERY_GROUP``) and
  subscribes to the main log of every topic with a subscription here (cooperative-sticky: a
  topic joining or leaving moves no other partition). Owning a main partition means owning
  that partition index of every subscription of the topic. It is also the *live* reader: each
  record goes to the subscriptions whose cursor takes it (``delivery/cursors.py``).
- The **catch-up** consumer (assigned, outside any group) reads main partitions for cursors
  behind the live reader, in turns.
- The **tiers** consumer (assigned, outside any group) reads the subscriptions' retry tiers and
  DLQs, with the pauses and seeks each subscription's flow asks for (``delivery/flow.py``).

Each subscription's runner sees all this through a :class:`delivery.views.SubscriptionView`,
which speaks the runner's consumer port; its offsets stay in its own consumer group
(``state/group_offsets.py``). Everything here but the consumer threads runs on the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from delivery.commits import transient
from delivery.cursors import PartitionCursors, Turn
from delivery.kafka_io import POLL_TIMEOUT_S, ConsumerThread, consumer_config
from setu.batching import Batched, in_thread
from setu.limits import MessageLimits

if TYPE_CHECKING:
    from delivery.views import SubscriptionView

log = logging.getLogger(__name__)

# Records a catch-up turn reads for its cursors before the next behind cursor's turn.
TURN_RECORDS = 2048
# A catch-up seek (or assignment) the client refused is asked again after this long.
CATCH_UP_RETRY_S = 0.05
# Takeovers that run at once in a worker (ReaderHub._takeovers). With 16, a worker taking
# over 1,000 new subscriptions spent 1.4 s on each and 44 s waiting for a slot; with 64, 4 s
# and 28 s, and every endpoint was reached 55 s after the creates, not 83 s (decision 0014).
# Their claims read the shared changelog together and their Redis work goes in shared
# pipelines, so they advance in waves: with 64, 64 ended every 1.5 s while the machine had
# cores to spare; with 256, the last endpoint was reached 16 s after the creates, not 25 s
# (docs/delivery.md, "Many subscriptions at once").
TAKEOVER_CONCURRENCY = 256
# How long a main partition's assignment waits for its subscriptions' takeovers before the
# live reader starts on it. Takeovers not done by then go on and add their cursors when they
# are, behind the live reader (the catch-up reader serves them until they reach it): waiting
# for all of them held a worker's reading of its partitions for a minute with 200
# subscriptions, and the group's next rebalance with it.
TAKEOVER_WAIT_S = 2.0
# How long a partition's first or end offset, which a takeover needs, is asked again while
# Kafka is away (a broker restarting: its partitions have no leader, or no broker answers).
# Past it the takeover fails: a subscription's runner starts again, and a main partition's
# assignment ends the worker, whose supervisor starts it again.
OFFSET_WAIT_S = 120.0
OFFSET_RETRY_S = (0.2, 5.0)  # the first wait between asks, and the longest


def reader_config(
    bootstrap: str,
    group: str,
    client_id: str,
    limits: MessageLimits,
    client_config: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A reader's consumer, as a subscription's (``consumer_config``) but for the assignor:
    only the membership consumer joins ``group``, and a topic joining or leaving it should
    move no other partition."""
    return {
        **consumer_config(bootstrap, group, client_id, limits, client_config),
        "partition.assignment.strategy": "cooperative-sticky",
    }


class _Batches:
    """A :class:`ConsumerThread` listener that only takes batches (the hub's readers handle
    their rebalances themselves)."""

    def __init__(self, on_batch: Callable[[list[Message]], None]) -> None:
        self.on_batch = on_batch


class ReaderThread(ConsumerThread):
    """A consumer polled on its own thread, as :class:`ConsumerThread` (commands between
    polls, each may post a callback to the loop after it ran; batches to ``on_batch`` on the
    loop), that starts with no topics: it is assigned partitions, or told to
    :meth:`subscribe`, and then its incremental rebalances call ``assigned``/``revoked``/
    ``lost`` on the loop and wait for them."""

    def __init__(
        self,
        name: str,
        config: dict[str, Any],
        loop: asyncio.AbstractEventLoop,
        on_batch: Callable[[list[Message]], None],
        *,
        assigned: Callable[[list[TopicPartition]], Awaitable[list[TopicPartition]]] | None = None,
        revoked: Callable[[list[TopicPartition]], Awaitable[None]] | None = None,
        lost: Callable[[list[TopicPartition]], None] | None = None,
    ) -> None:
        super().__init__(config, loop, _Batches(on_batch))  # type: ignore[arg-type]
        self.name = name
        self._assigned_cb = assigned
        self._revoked_cb = revoked
        self._lost_cb = lost
        self._thread = threading.Thread(target=self._run, name=f"reader-{name}", daemon=True)
        # Whether the consumer has partitions, as last asked; None: ask again (a command or a
        # rebalance may have changed it). Asking builds the whole assignment, a thousand
        # partitions and more for the tiers reader, so it is not asked at every poll.
        self._has_partitions: bool | None = None

    def start(self, topics: Sequence[str] = ()) -> None:
        self._thread.start()
        if topics:
            self.subscribe(topics)

    def subscribe(self, topics: Sequence[str]) -> None:
        """Subscribes to ``topics`` from now on; none: leaves every partition."""
        wanted = list(topics)

        def command(consumer: Consumer) -> None:
            if wanted:
                consumer.subscribe(
                    wanted,
                    on_assign=self._on_assign,
                    on_revoke=self._on_revoke,
                    on_lost=self._on_lost,
                )
            else:
                consumer.unsubscribe()

        self.post(command)

    def _opened(self, consumer: Consumer) -> None:
        pass  # assigned partitions, or told to subscribe later

    def _may_take(self, consumer: Consumer) -> bool:
        if self._has_partitions is None:
            self._has_partitions = bool(consumer.assignment())
        if self._has_partitions:
            return True
        # Serves rebalances and callbacks meanwhile. One that assigned partitions (the
        # membership's, inside this poll) may be followed within it by their first record:
        # handed over like any, or the cursors would take the next one and skip it.
        first = consumer.poll(POLL_TIMEOUT_S)
        if first is not None:
            self._loop.call_soon_threadsafe(self._listener.on_batch, [first])
        return False

    def _run_commands(self, consumer: Consumer) -> None:
        if not self._commands.empty():
            self._has_partitions = None
        super()._run_commands(consumer)

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._has_partitions = None
        assert self._assigned_cb is not None
        starts: list[TopicPartition] = self._wait(self._assigned_cb(partitions))
        consumer.incremental_assign(starts)

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._has_partitions = None
        assert self._revoked_cb is not None
        self._wait(self._revoked_cb(partitions))
        consumer.incremental_unassign(partitions)

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._has_partitions = None
        assert self._lost_cb is not None
        self._loop.call_soon_threadsafe(self._lost_cb, partitions)
        consumer.incremental_unassign(partitions)


class ReaderHub:
    """The readers of one worker and who reads what through them (see the module doc)."""

    def __init__(
        self,
        config: Callable[[str], dict[str, Any]],
        low_offset: Callable[[str, int], int],
        group: str,
        turn_records: int = TURN_RECORDS,
        end_offset: Callable[[str, int], int] | None = None,
    ) -> None:
        """``config(group)``: a reader's consumer settings; ``low_offset(topic, partition)``:
        a partition's first offset, ``end_offset`` its end (blocking, run in a thread; None:
        the first offset); ``group``: the workers' group (``SETU_DELIVERY_GROUP``)."""
        self._group = group
        self._config = config
        self._low_offset = low_offset
        self._end_offset = end_offset or low_offset
        # A partition's first offset, asked by every subscription of its topic that takes it
        # over with nothing committed (a thousand new ones): one ask per partition at a time.
        self._firsts: Batched[tuple[str, int], int] = Batched(in_thread(self._firsts_of))
        self._turn_records = turn_records
        self._pending_takeovers: set[asyncio.Task[None]] = set()
        self._views: dict[str, set[SubscriptionView]] = defaultdict(set)  # main topic -> views
        self._by_key: dict[str, SubscriptionView] = {}  # a cursor's key -> its view
        self._owned: dict[tuple[str, int], PartitionCursors] = {}
        # Main partitions being given up (revoked, not yet forgotten): no new takeover of them.
        self._revoking: set[tuple[str, int]] = set()
        self._tier_owner: dict[str, SubscriptionView] = {}  # tier or DLQ topic -> view
        # Catch-up: per main partition, the turn being read and whether its seek took.
        self._turns: dict[tuple[str, int], tuple[Turn, bool]] = {}
        self._catching: set[tuple[str, int]] = set()  # assigned to the catch-up consumer
        self._asking_first: set[tuple[str, int]] = set()  # see _ask_first
        self._started = False
        self._closing = False
        # Takeovers at once, whether of an assignment or of runners starting (a thousand new
        # subscriptions): each holds Redis connections and Kafka reads while it runs.
        self._takeovers = asyncio.Semaphore(TAKEOVER_CONCURRENCY)
        # Resolves with the error when a reader ended on its own (see _reader_ended).
        self.failed: asyncio.Future[BaseException] = asyncio.get_running_loop().create_future()
        self.membership: ReaderThread
        self.catch_up: ReaderThread
        self.tiers: ReaderThread

    def start(self, loop: asyncio.AbstractEventLoop, client_id: str) -> None:
        self.membership = ReaderThread(
            "membership",
            self._config(self._group),
            loop,
            self._on_live,
            assigned=self._main_assigned,
            revoked=self._main_revoked,
            lost=self._main_lost,
        )
        self.catch_up = ReaderThread(
            "catch-up",
            {**self._config(f"{self._group}.catch-up"), "enable.partition.eof": True},
            loop,
            self._on_catch_up,
        )
        self.tiers = ReaderThread(
            "tiers", self._config(f"{self._group}.tiers"), loop, self._on_tiers
        )
        for reader in (self.membership, self.catch_up, self.tiers):
            reader.start()
            reader.done.add_done_callback(self._reader_ended)
        self._started = True
        del client_id

    def _reader_ended(self, done: asyncio.Future[None]) -> None:
        """A reader that ended before :meth:`close` (its consumer failed) ends the worker:
        every subscription here reads through it. The worker's supervisor starts it again."""
        if self._closing or done.cancelled():
            return
        error = done.exception() or RuntimeError("a reader stopped")
        if not self.failed.done():
            self.failed.set_result(error)

    async def close(self) -> None:
        self._closing = True
        for task in list(self._pending_takeovers):
            task.cancel()
        await asyncio.gather(*self._pending_takeovers, return_exceptions=True)
        if not self._started:
            return
        self.membership.subscribe([])
        await asyncio.gather(self.membership.close(), self.catch_up.close(), self.tiers.close())

    # Subscriptions come and go.

    def register(self, view: SubscriptionView) -> None:
        """A runner started: it reads its topic's main log and its own tiers from now on."""
        views = self._views[view.main_topic]
        first = not views
        views.add(view)
        self._by_key[view.key] = view
        for topic in view.tier_topics:
            self._tier_owner[topic] = view
        owned = sorted(p for (t, p) in self._owned if t == view.main_topic and self.owns(t, p))
        if owned:
            asyncio.get_running_loop().create_task(self._take_over(view, owned))
        if first:
            self._resubscribe()

    async def unregister(self, view: SubscriptionView) -> None:
        """A runner stops: its partitions are revoked from it (drained, committed). It leaves
        the hub also when that fails or is cancelled (a stop that timed out): cursors left
        behind would go on taking records, for whichever view holds its name next."""
        owned = sorted(p for (t, p) in self._owned if t == view.main_topic)
        try:
            await view.give_up(owned)
        finally:
            self._leave(view)

    def _leave(self, view: SubscriptionView) -> None:
        for key, cursors in self._owned.items():
            if key[0] == view.main_topic and view.key in cursors:
                cursors.remove(view.key)
                self._plan_catch_up(key)
        for topic in view.tier_topics:
            if self._tier_owner.get(topic) is view:
                del self._tier_owner[topic]
        if self._by_key.get(view.key) is view:
            del self._by_key[view.key]
        views = self._views.get(view.main_topic)
        if views is not None:
            views.discard(view)
            if not views:
                del self._views[view.main_topic]
                self._resubscribe()

    def _resubscribe(self) -> None:
        self.membership.subscribe(sorted(self._views))

    # The membership: main partitions taken over and given up.

    def owns(self, topic: str, partition: int) -> bool:
        key = (topic, partition)
        return key in self._owned and key not in self._revoking

    async def _main_assigned(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        by_topic: dict[str, list[int]] = defaultdict(list)
        for tp in partitions:
            self._owned[(tp.topic, tp.partition)] = PartitionCursors(self._turn_records)
            by_topic[tp.topic].append(tp.partition)
        loop = asyncio.get_running_loop()
        takeovers = [
            loop.create_task(self._take_over(view, indices))
            for topic, indices in by_topic.items()
            for view in list(self._views.get(topic, ()))
        ]
        self._pending_takeovers.update(takeovers)
        for task in takeovers:
            task.add_done_callback(self._pending_takeovers.discard)
        if takeovers:
            await asyncio.wait(takeovers, timeout=TAKEOVER_WAIT_S)
        starts = []
        for tp in partitions:
            key = (tp.topic, tp.partition)
            cursors = self._owned[key]
            start = cursors.live_start()
            if start is None:
                # No subscription taken over yet: from the end, where those still being
                # taken over most likely are (an idle topic); any behind is caught up.
                start = await _asked_while_away(self._end_at, tp.topic, tp.partition)
                cursors.live_next = start
            starts.append(TopicPartition(tp.topic, tp.partition, start))
            self._plan_catch_up(key)
        if starts:
            log.info("reading main partitions %s", [(t.topic, t.partition) for t in starts])
        return starts

    async def _take_over(self, view: SubscriptionView, partitions: list[int]) -> None:
        queued = time.monotonic()
        try:
            async with self._takeovers:
                starts = await view.take_over(partitions, time.monotonic() - queued)
            firsts = {
                p: await _asked_while_away(self._first_at, view.main_topic, p)
                for p, offset in starts.items()
                if offset < 0
            }
        except Exception as exc:
            view.fail(exc)
            return
        # A takeover waits for the subscription's offsets and its runner: a partition revoked
        # or lost meanwhile, before the view held it (so its give_up found nothing to give),
        # is let go now, with nothing committed: its next owner may have begun already, and a
        # view left holding it would go on with its retry tiers beside that owner.
        gone = sorted(p for p in starts if not self.owns(view.main_topic, p))
        if gone:
            log.info("%s: partitions %s moved on during their takeover; let go", view.group, gone)
            view.lose(gone)
        for partition, offset in starts.items():
            key = (view.main_topic, partition)
            cursors = self._owned.get(key)
            if cursors is None or partition in gone:
                continue
            cursors.add(view.key, firsts.get(partition, offset))
            cursors.set_room(view.key, view.has_room(partition))
            self._plan_catch_up(key)

    async def _main_revoked(self, partitions: list[TopicPartition]) -> None:
        log.info("giving up main partitions %s", [(t.topic, t.partition) for t in partitions])
        by_topic: dict[str, list[int]] = defaultdict(list)
        keys = [(tp.topic, tp.partition) for tp in partitions]
        self._revoking.update(keys)
        try:
            for tp in partitions:
                by_topic[tp.topic].append(tp.partition)
            work = [
                view.give_up(indices)
                for topic, indices in by_topic.items()
                for view in list(self._views.get(topic, ()))
            ]
            await asyncio.gather(*work, return_exceptions=True)
            for key in keys:
                self._forget(key)
        finally:
            self._revoking.difference_update(keys)

    def _main_lost(self, partitions: list[TopicPartition]) -> None:
        log.warning(
            "main partitions lost (this worker left the group unannounced): %s",
            [(t.topic, t.partition) for t in partitions],
        )
        for tp in partitions:
            for view in list(self._views.get(tp.topic, ())):
                view.lose([tp.partition])
            self._forget((tp.topic, tp.partition))

    def _forget(self, key: tuple[str, int]) -> None:
        self._owned.pop(key, None)
        self._turns.pop(key, None)
        if key in self._catching:
            self._catching.discard(key)
            tp = [TopicPartition(*key)]
            self.catch_up.post(lambda c: c.incremental_unassign(tp))

    # Records.

    def _on_live(self, messages: list[Message]) -> None:
        handed: dict[str, list[Message]] = defaultdict(list)
        touched = set()
        for msg in messages:
            if _failed(msg, "membership"):
                continue
            key = (msg.topic() or "", msg.partition() or 0)
            cursors = self._owned.get(key)
            if cursors is None:
                continue
            for sub in cursors.offer_live(msg.offset() or 0):
                handed[sub].append(msg)
            touched.add(key)
        self._hand(handed)
        for key in touched:
            self._plan_catch_up(key)

    def _on_catch_up(self, messages: list[Message]) -> None:
        handed: dict[str, list[Message]] = defaultdict(list)
        touched = set()
        for msg in messages:
            key = (msg.topic() or "", msg.partition() or 0)
            current = self._turns.get(key)
            cursors = self._owned.get(key)
            if current is None or not current[1] or cursors is None:
                continue  # read before its turn's seek took, or no longer ours
            if cursors.current is not current[0]:
                # The turn sought ended (used up, or its riders left): what follows, up to
                # the next turn's seek, was read for it, records and end alike.
                continue
            error = msg.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    cursors.caught_up(msg.offset() or 0)
                    touched.add(key)
                else:
                    log.warning("catch-up reader: %s", error)
                continue
            for sub in cursors.offer_catch_up(msg.offset() or 0):
                handed[sub].append(msg)
            touched.add(key)
        self._hand(handed)
        for key in touched:
            cursors = self._owned.get(key)
            if cursors is not None and cursors.asking_first and key not in self._asking_first:
                self._asking_first.add(key)
                asyncio.get_running_loop().create_task(self._ask_first(key, cursors))
            self._plan_catch_up(key)

    async def _first_at(self, topic: str, partition: int) -> int:
        return await self._firsts.ask((topic, partition))

    async def _end_at(self, topic: str, partition: int) -> int:
        return await asyncio.to_thread(self._end_offset, topic, partition)

    def _firsts_of(self, keys: list[tuple[str, int]]) -> dict[tuple[str, int], int | BaseException]:
        out: dict[tuple[str, int], int | BaseException] = {}
        for key in keys:
            try:
                out[key] = self._low_offset(*key)
            except Exception as exc:  # that partition's callers ask again
                out[key] = exc
        return out

    async def _ask_first(self, key: tuple[str, int], cursors: PartitionCursors) -> None:
        """A catch-up turn read past where it expected: asks the partition's first offset, so
        that only what retention removed is crossed (delivery/cursors.py), then turns go on."""
        log.info("catch-up reader: %s read past its turn's next offset; reading again", key)
        first = 0
        try:
            first = await self._firsts.ask(key)
        except Exception as exc:  # Kafka away: nothing is crossed, the turn is read again
            log.warning("catch-up reader: first offset of %s not known: %s", key, exc)
        finally:
            self._asking_first.discard(key)
            cursors.learned_first(first)
            self._plan_catch_up(key)

    def _on_tiers(self, messages: list[Message]) -> None:
        handed: dict[SubscriptionView, list[Message]] = defaultdict(list)
        for msg in messages:
            if _failed(msg, "tiers"):
                continue
            view = self._tier_owner.get(msg.topic() or "")
            if view is not None:
                handed[view].append(msg)
        for view, batch in handed.items():
            view.deliver(batch)

    def _hand(self, handed: Mapping[str, list[Message]]) -> None:
        for sub, batch in handed.items():
            view = self._by_key.get(sub)
            if view is not None:
                view.deliver(batch)

    # Catch-up turns.

    def room_changed(self, view: SubscriptionView, partition: int, room: bool) -> None:
        key = (view.main_topic, partition)
        cursors = self._owned.get(key)
        if cursors is None or view.key not in cursors:
            return
        cursors.set_room(view.key, room)
        self._plan_catch_up(key)

    def seek(self, view: SubscriptionView, partition: int, offset: int) -> None:
        key = (view.main_topic, partition)
        cursors = self._owned.get(key)
        if cursors is not None and view.key in cursors:
            cursors.seek(view.key, offset)
            self._plan_catch_up(key)

    def _plan_catch_up(self, key: tuple[str, int]) -> None:
        """Points the catch-up consumer at the partition's current turn: a new turn seeks
        there first (records read before the seek took are not offered); no turn pauses the
        partition."""
        cursors = self._owned.get(key)
        if cursors is None:
            return
        turn = cursors.turn()
        current = self._turns.get(key)
        if turn is None:
            if current is not None:
                del self._turns[key]
                tp = [TopicPartition(*key)]
                self.catch_up.post(lambda c: c.pause(tp))
            return
        if current is not None and current[0] is turn:
            return
        self._turns[key] = (turn, False)
        start = TopicPartition(key[0], key[1], turn.offset)
        assign = key not in self._catching
        self._catching.add(key)
        refused: list[Exception] = []

        def command(consumer: Consumer) -> None:
            try:
                if assign:
                    consumer.incremental_assign([start])
                else:
                    consumer.resume([TopicPartition(*key)])
                    consumer.seek(start)
            except (KafkaException, RuntimeError, ValueError) as exc:
                refused.append(exc)

        def took() -> None:
            now = self._turns.get(key)
            if now is None or now[0] is not turn:
                return
            if not refused:
                self._turns[key] = (turn, True)
                return
            # Refused (librdkafka refuses a seek while the partition's fetcher is still
            # starting): the reader is still where it was, so what it reads is not the
            # turn's; its records stay ignored until a seek takes.
            log.info("catch-up reader: %s to %d refused (%s); again", key, turn.offset, refused[0])
            del self._turns[key]
            if assign:
                self._catching.discard(key)
            asyncio.get_running_loop().call_later(CATCH_UP_RETRY_S, self._plan_catch_up, key)

        self.catch_up.post(command, took)


async def _asked_while_away(
    ask: Callable[[str, int], Awaitable[int]], topic: str, partition: int
) -> int:
    """``ask(topic, partition)``, asked again while it fails for Kafka being away, up to
    :data:`OFFSET_WAIT_S`."""
    deadline = time.monotonic() + OFFSET_WAIT_S
    wait = OFFSET_RETRY_S[0]
    while True:
        try:
            return await ask(topic, partition)
        except Exception as exc:
            if not transient(exc) or time.monotonic() + wait > deadline:
                raise
            log.warning("offsets of %s [%d] not known yet: %s", topic, partition, exc)
        await asyncio.sleep(wait)
        wait = min(wait * 2, OFFSET_RETRY_S[1])


def _failed(msg: Message, reader: str) -> bool:
    error = msg.error()
    if error is None:
        return False
    if error.code() != KafkaError._PARTITION_EOF:
        log.warning("%s reader: %s", reader, error)
    return True
