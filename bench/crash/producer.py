"""The crash test's replayable producer.

Runs as its own process (``python -m bench.crash.producer``) with several *lanes*; a lane is one
producer id that owns a fixed set of groups and publishes its records strictly one at a time,
with increasing sequence ids. One at a time, because two concurrent requests of one producer id
may reach Kafka in either order, and then de-duplication by "sequence not above the highest
seen" would rightly drop the one that lands second.

For each sequence a lane journals ``sent`` (fsynced before the first attempt), retries the
produce call with the same ids and bytes until a 2xx, then journals ``ack`` (fsynced before the
next sequence). So at any kill, the journal holds every acknowledged record, and at most one
record per lane is ``sent`` without ``ack``: it may or may not be in Setu.

On restart a lane resumes after the higher of its journal's last ``ack`` and the server's
``GET .../producers/{id}``; records the server already has but the journal lacks are journalled
as ``ack`` with ``via: server``. The ``sent``-but-unacknowledged record is re-sent with the same
ids, so if it did reach Setu the re-send is a duplicate that Setu drops.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import signal
import sys
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar
from urllib.parse import quote

import httpx

from bench.crash.journal import Entry, Journal, read_entries
from bench.crash.records import Record, is_stream_lane, make_record, producer_name
from setu.client import AsyncStreamProducer, Backoff, StreamError

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class LaneProgress:
    """What a lane's journal says: highest sequence acknowledged and highest sent (-1: none)."""

    last_acked: int = -1
    last_sent: int = -1


@dataclass(frozen=True, slots=True)
class ResumePoint:
    """Where a restarted lane goes on: ``confirm`` are sequences to journal as acknowledged
    because the server has them, ``next_sequence`` is the first one to (re-)send."""

    next_sequence: int
    confirm: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ProducerConfig:
    api: str
    project: str
    topic: str
    run_id: str
    groups: int
    lanes: int
    messages_per_lane: int
    rate_per_second: float
    large_body_bytes: int = 0  # see bench.crash.records.make_record
    # The last ``stream_lanes`` lanes stream to ``stream`` (host:port) instead of HTTP.
    stream_lanes: int = 0
    stream: str = ""
    # Each streaming lane drops its connection (FIN or RST, at random) every this many seconds
    # on average, as a producer restart or a load balancer would (0: never); journalled "drop".
    stream_drop_s: float = 0.0
    request_timeout_s: float = 5.0
    # First and longest pause between attempts; pauses double up to the longest.
    backoff_s: tuple[float, float] = (0.05, 1.0)

    def streams(self, lane: int) -> bool:
        return is_stream_lane(lane, self.lanes, self.stream_lanes)

    def record(self, lane: int, sequence: int) -> Record:
        return make_record(
            self.run_id,
            self.groups,
            self.lanes,
            lane,
            sequence,
            self.large_body_bytes,
            stream=self.streams(lane),
        )

    def topic_path(self) -> str:
        return f"/v1/projects/{quote(self.project)}/topics/{quote(self.topic)}"


def lane_progress(entries: list[Entry], producer_id: str) -> LaneProgress:
    """Fold one lane's journal entries into its progress."""
    acked = sent = -1
    for entry in entries:
        if entry.get("pid") != producer_id:
            continue
        if entry["e"] == "ack":
            acked = max(acked, int(entry["seq"]))
        elif entry["e"] == "sent":
            sent = max(sent, int(entry["seq"]))
    return LaneProgress(last_acked=acked, last_sent=max(sent, acked))


def resume_point(progress: LaneProgress, server_last: int) -> ResumePoint:
    """Resume after whichever of journal and server knows more; the server only lags."""
    confirm = tuple(range(progress.last_acked + 1, server_last + 1))
    return ResumePoint(next_sequence=max(progress.last_acked, server_last) + 1, confirm=confirm)


def produce_headers(record: Record, lane: int) -> dict[str, str]:
    """Identity headers; odd lanes use the ``X-`` spelling, even lanes ``X_`` (both are valid)."""
    sep = "-" if lane % 2 else "_"
    return {
        f"X{sep}MESSAGE{sep}ID": record.message_id,
        f"X{sep}GROUP{sep}ID": record.group_id,
        f"X{sep}PRODUCER{sep}ID": record.producer_id,
        f"X{sep}SEQUENCE{sep}ID": str(record.sequence_id),
        "content-type": "application/octet-stream",
        **{f"X{sep}TAG{sep}{n}": f"{n:03d}" * 33 + "x" for n in range(record.extra_headers)},
        **(
            {f"X{sep}DELIVER{sep}AFTER{sep}MS": str(record.deliver_after_ms)}
            if record.deliver_after_ms
            else {}
        ),
    }


def sent_entry(record: Record) -> Entry:
    return {
        "e": "sent",
        "pid": record.producer_id,
        "seq": record.sequence_id,
        "mid": record.message_id,
        "gid": record.group_id,
        "hash": record.payload_hash,
    }


def ack_entry(record: Record, via: str) -> Entry:
    return {"e": "ack", "pid": record.producer_id, "seq": record.sequence_id, "via": via}


class Pacer:
    """Spaces calls ``1/rate`` seconds apart on a fixed schedule. After a stall (an API
    restart) it catches up at full speed, but by at most ``catch_up_s`` seconds of schedule."""

    def __init__(self, rate_per_second: float, catch_up_s: float = 10.0) -> None:
        self._interval = 1.0 / rate_per_second if rate_per_second > 0 else 0.0
        self._catch_up_s = catch_up_s
        self._next = time.monotonic()

    async def wait(self) -> None:
        if self._interval == 0.0:
            return
        now = time.monotonic()
        self._next = max(self._next + self._interval, now - self._catch_up_s)
        if self._next > now:
            await asyncio.sleep(self._next - now)


async def _then_true(work: Awaitable[None]) -> bool:
    await work
    return True


class Producer:
    """All lanes of one producer process, sharing one HTTP client and one journal."""

    def __init__(
        self,
        config: ProducerConfig,
        client: httpx.AsyncClient,
        journal: Journal,
        api_key: str = "",
    ):
        self.config = config
        self.client = client
        self.journal = journal
        self.api_key = api_key
        self.stop = asyncio.Event()
        self.errors = 0

    async def run(self, entries: list[Entry]) -> bool:
        """Run every lane to its last record or until :attr:`stop`; True when all finished."""
        lanes = [self._lane(lane, entries) for lane in range(self.config.lanes)]
        finished = await asyncio.gather(*lanes)
        return all(finished)

    async def _lane(self, lane: int, entries: list[Entry]) -> bool:
        if self.config.streams(lane):
            return await self._stream_lane(lane, entries)
        producer_id = producer_name(self.config.run_id, lane)
        progress = lane_progress(entries, producer_id)
        server_last = await self._server_last(producer_id)
        if server_last is None:
            return False
        point = resume_point(progress, server_last)
        for sequence in point.confirm:
            record = self.config.record(lane, sequence)
            if sequence > progress.last_sent:
                await self.journal.append(sent_entry(record))
            await self.journal.append(ack_entry(record, "server"))
        pacer = Pacer(self.config.rate_per_second / self.config.lanes)
        last_sent = max(progress.last_sent, server_last)
        for sequence in range(point.next_sequence, self.config.messages_per_lane):
            await pacer.wait()
            if self.stop.is_set():
                return False
            record = self.config.record(lane, sequence)
            if sequence > last_sent:
                await self.journal.append(sent_entry(record))
            if not await self._send_until_accepted(record, lane):
                return False
            await self.journal.append(ack_entry(record, "http"))
        return True

    async def _stream_lane(self, lane: int, entries: list[Entry]) -> bool:
        """A lane over streaming produce: many messages in flight, each journalled ``sent``
        before it goes and ``ack`` once an ACK's point passes it. On start the stream's
        NOTIFY_ACK point says where to go on; what the server holds beyond the journal is
        journalled ``ack`` ``via: server``."""
        producer_id = producer_name(self.config.run_id, lane)
        progress = lane_progress(entries, producer_id)
        backoff, longest = self.config.backoff_s
        stream = AsyncStreamProducer(
            self.config.stream,
            self.api_key,
            self.config.project,
            self.config.topic,
            producer_id,
            program="bench.crash.producer",
            backoff=Backoff(initial_s=backoff, max_s=longest),
        )
        finished = False
        dropping = (
            asyncio.create_task(self._drop_forever(stream, producer_id))
            if self.config.stream_drop_s > 0
            else None
        )
        try:
            point = await self._until_stopped(stream.start())
            if point is None:
                return False
            journalled = progress.last_acked + 1
            for sequence in range(journalled, point):
                record = self.config.record(lane, sequence)
                if sequence > progress.last_sent:
                    await self.journal.append(sent_entry(record))
                await self.journal.append(ack_entry(record, "server"))
            journalled = max(journalled, point)
            pacer = Pacer(self.config.rate_per_second / self.config.lanes)
            last_sent = max(progress.last_sent, point - 1)
            for sequence in range(point, self.config.messages_per_lane):
                await pacer.wait()
                if self.stop.is_set():
                    return False
                record = self.config.record(lane, sequence)
                if sequence > last_sent:
                    await self.journal.append(sent_entry(record))
                sending = stream.send(record.body, group_id=record.group_id, sequence_id=sequence)
                if await self._until_stopped(sending) is None:
                    return False
                journalled = await self._journal_acks(lane, journalled, stream.durable)
            if await self._until_stopped(_then_true(stream.flush())) is None:
                return False
            await self._journal_acks(lane, journalled, stream.durable)
            finished = True
            return True
        except StreamError as exc:
            print(f"stream {producer_id}: {exc}", file=sys.stderr)
            return False
        finally:
            if dropping is not None:
                dropping.cancel()
            if finished:
                await stream.close()
            else:
                with contextlib.suppress(StreamError):
                    await asyncio.wait_for(stream.close(), 5.0)

    async def _drop_forever(self, stream: AsyncStreamProducer, producer_id: str) -> None:
        """Drops the lane's connection now and then, with messages in flight or not; the
        producer reconnects and resends what no ACK covered (docs/streaming.md,
        "Reconnecting")."""
        mean = self.config.stream_drop_s
        while True:
            await asyncio.sleep(random.uniform(0.5 * mean, 1.5 * mean))
            if not stream.connected:
                continue
            how = random.choice(("close", "reset"))
            stream.reconnect(reset=how == "reset")
            entry = {"e": "drop", "pid": producer_id, "how": how, "t": int(time.time() * 1000)}
            await self.journal.append(entry)

    async def _journal_acks(self, lane: int, journalled: int, durable: int) -> int:
        """Journals ``ack`` for every sequence from ``journalled`` up to ``durable``."""
        # Appended together: the journal syncs them with one fsync.
        await asyncio.gather(
            *(
                self.journal.append(ack_entry(self.config.record(lane, sequence), "stream"))
                for sequence in range(journalled, durable)
            )
        )
        return max(journalled, durable)

    async def _until_stopped(self, work: Awaitable[T]) -> T | None:
        """``work``'s result, or None when the producer is stopped first."""
        task = asyncio.ensure_future(work)
        stopped = asyncio.ensure_future(self.stop.wait())
        try:
            await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
        if task.done():
            return task.result()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return None

    async def _server_last(self, producer_id: str) -> int | None:
        """``last_sequence_id`` from the API, retried until it answers; None if stopped."""
        path = f"{self.config.topic_path()}/producers/{quote(producer_id)}"
        backoff, longest = self.config.backoff_s
        while not self.stop.is_set():
            try:
                response = await self.client.get(path)
                if response.status_code == 200:
                    return int(response.json()["last_sequence_id"])
            except httpx.HTTPError:
                pass
            self.errors += 1
            await self._pause(backoff)
            backoff = min(backoff * 2, longest)
        return None

    async def _send_until_accepted(self, record: Record, lane: int) -> bool:
        """Produce ``record`` until a 2xx (True) or until stopped (False)."""
        path = f"{self.config.topic_path()}/produce"
        headers = produce_headers(record, lane)
        backoff, longest = self.config.backoff_s
        while not self.stop.is_set():
            try:
                response = await self.client.post(path, content=record.body, headers=headers)
                if response.is_success:
                    return True
                if response.status_code < 500 and response.status_code not in (408, 429):
                    print(
                        f"produce {record.message_id}: {response.status_code} {response.text}",
                        file=sys.stderr,
                    )
            except httpx.HTTPError:
                pass
            self.errors += 1
            await self._pause(backoff)
            backoff = min(backoff * 2, longest)
        return False

    async def _pause(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stop.wait(), seconds)


async def produce(config: ProducerConfig, journal_path: Path) -> bool:
    """Resume from the journal and run until done or SIGTERM; True when every record is acked."""
    entries = read_entries(journal_path)
    journal = await Journal(journal_path).open()
    timeout = httpx.Timeout(config.request_timeout_s)
    limits = httpx.Limits(max_connections=config.lanes, max_keepalive_connections=config.lanes)
    key = os.environ.get("SETU_API_KEY")
    auth = {"Authorization": f"Bearer {key}"} if key else {}
    async with httpx.AsyncClient(
        base_url=config.api, timeout=timeout, limits=limits, headers=auth
    ) as client:
        producer = Producer(config, client, journal, key or "")
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, producer.stop.set)
        loop.add_signal_handler(signal.SIGINT, producer.stop.set)
        await journal.append({"e": "start", "t": int(time.time() * 1000)})
        finished = await producer.run(entries)
        if finished:
            await journal.append({"e": "done", "t": int(time.time() * 1000)})
    await journal.close()
    return finished


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Crash-test producer")
    parser.add_argument("--api", required=True, help="Setu API base URL")
    parser.add_argument("--project", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--groups", type=int, required=True)
    parser.add_argument("--lanes", type=int, required=True)
    parser.add_argument("--messages-per-lane", type=int, required=True)
    parser.add_argument("--rate", type=float, default=0.0, help="messages/s overall; 0: no limit")
    parser.add_argument("--journal", type=Path, required=True)
    parser.add_argument("--large-body-bytes", type=int, default=0, help="the API's size limit")
    parser.add_argument("--stream-lanes", type=int, default=0, help="lanes that stream")
    parser.add_argument("--stream", default="", help="host:port of streaming produce")
    parser.add_argument(
        "--stream-drop-s", type=float, default=0.0, help="mean seconds between dropped connections"
    )
    args = parser.parse_args(argv)
    config = ProducerConfig(
        api=args.api,
        project=args.project,
        topic=args.topic,
        run_id=args.run_id,
        groups=args.groups,
        lanes=args.lanes,
        messages_per_lane=args.messages_per_lane,
        rate_per_second=args.rate,
        large_body_bytes=args.large_body_bytes,
        stream_lanes=args.stream_lanes,
        stream=args.stream,
        stream_drop_s=args.stream_drop_s,
    )
    finished = asyncio.run(produce(config, args.journal))
    # Exit 0 only when every record was acknowledged; a stopped producer exits 3.
    sys.exit(0 if finished else 3)


if __name__ == "__main__":
    main()
