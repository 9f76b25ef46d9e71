"""A streaming producer: one stream over Setu's streaming produce protocol (docs/streaming.md).

:class:`AsyncStreamProducer` (asyncio) and :class:`StreamProducer` (blocking, for threads) do the
same thing:

- connect, HELLO with the API key as cookie, NOTIFY the stream
  ``{project}/{topic}/{producer_id}``, and start from the point NOTIFY_ACK gives: the next
  sequence id is the first the server does not hold;
- give each message the next sequence id (or the caller's, if higher), spend a credit on it and
  keep it until an ACK says it is in Kafka; with no credit left, :meth:`send` waits (the server
  returns credits as Kafka acknowledges writes, so a slow Setu slows the caller);
- on a lost connection, RESTART, or an error the server calls passing
  (``dependency_unavailable``), reconnect with backoff, NOTIFY again and resend every kept
  message from the new point on. Anything below it is durable already, and the server drops a
  resend of it, so nothing reaches the main log twice;
- any other error (bad key, invalid message, unknown topic) ends the producer: every waiting and
  later call raises :class:`StreamError` with the server's code and reason.

Standard library only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import socket
import struct
import threading
from collections import deque
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from setu.client.errors import StreamError
from setu.stream import frames
from setu.stream.tcp import keep_alive

log = logging.getLogger(__name__)

T = TypeVar("T")

RETRYABLE = frozenset({"dependency_unavailable", "internal", "rate_limited", "request_timeout"})
# SO_LINGER on, 0 s: close() sends a RST.
_LINGER_ZERO = struct.pack("ii", 1, 0)
# The server's idle timeout when its OK does not say (docs/streaming.md, "Idle sessions").
_IDLE_TIMEOUT_S = 30.0
_READ_BYTES = 256 * 1024
# Gathered frames are written at once past this many, and the transport drained.
_OUTBOX_FRAMES = 256


@dataclass(frozen=True, slots=True)
class Backoff:
    """Reconnect delays: ``initial_s`` doubling up to ``max_s``, each with ±20 % jitter;
    ``give_up_s`` after the connection was lost (None: keep trying)."""

    initial_s: float = 0.1
    max_s: float = 5.0
    give_up_s: float | None = None

    def delay(self, attempt: int) -> float:
        base: float = min(self.max_s, self.initial_s * 2.0 ** min(attempt, 30))
        return base * random.uniform(0.8, 1.2)


class _Reconnect(Exception):
    """The connection ended in a way worth retrying."""


def header_block(
    headers: Mapping[str, str] | None,
    content_type: str | None,
    traceparent: str | None,
    tracestate: str | None,
) -> tuple[tuple[bytes, bytes], ...] | None:
    """A MESSAGE's header block (None: the message has none, and no HEADERS flag)."""
    block = [(name.encode(), value.encode()) for name, value in (headers or {}).items()]
    for name, value in (
        ("content-type", content_type),
        ("traceparent", traceparent),
        ("tracestate", tracestate),
    ):
        if value is not None:
            block.append((name.encode(), value.encode()))
    return tuple(block) if block else None


class AsyncStreamProducer:
    """Streams messages to one topic as one producer (see the module doc). ``on_durable``, if
    given, is called with the stream's new point each time an ACK moves it.

    ::

        producer = AsyncStreamProducer("localhost:8090", key, "shop", "orders", "checkout-1")
        await producer.start()
        await producer.send(b'{"total": 12}', group_id="order-7")
        await producer.close()  # waits until Kafka holds every message
    """

    def __init__(
        self,
        address: str,
        api_key: str,
        project: str,
        topic: str,
        producer_id: str,
        *,
        stream_id: int = 1,
        program: str = "setu.client",
        instance: str | None = None,
        backoff: Backoff | None = None,
        connect_timeout_s: float = 10.0,
        max_frame_bytes: int = frames.DEFAULT_MAX_FRAME_BYTES,
        on_durable: Callable[[int], None] | None = None,
    ) -> None:
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"address must be host:port, not {address!r}")
        self.host, self.port = host.strip("[]"), int(port)
        self.stream_name = f"{project}/{topic}/{producer_id}"
        self.stream_id = stream_id
        self._hello = frames.Hello(
            frames.PROTOCOL_VERSION,
            api_key.encode(),
            program.encode(),
            (instance or socket.gethostname()).encode(),
        )
        self._backoff = backoff or Backoff()
        self._connect_timeout_s = connect_timeout_s
        self._max_frame_bytes = max_frame_bytes
        # Called with the new point whenever it moves: every lower id is in Kafka.
        self._on_durable = on_durable
        self._next = 0
        self._durable = 0
        self._kept: deque[tuple[int, bytes]] = deque()  # (sequence id, its MESSAGE frame)
        self._outbox: list[bytes] = []  # frames sent this turn of the loop, not yet written
        self._credits = 0
        self._changed = asyncio.Event()
        self._ready = False
        self._fatal: StreamError | None = None
        self._closing = False
        self._eos_sent = False
        self._eos_acked = False
        self._writer: asyncio.StreamWriter | None = None
        self._idle_s = _IDLE_TIMEOUT_S
        self._sent = 0  # writes to the connection (a batch of frames counts once)
        self._heard = 0  # frames received on this connection
        self._runner: asyncio.Task[None] | None = None
        self._started: asyncio.Future[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        # Guards what sending touches (the next id, kept messages, credits, the outbox, the
        # connection): :class:`StreamProducer`'s callers send from their own threads.
        self._lock = threading.Lock()
        # Called on the loop's thread whenever something a waiting sender waits for changed.
        self._on_change: Callable[[], None] | None = None
        self.reconnects = 0

    # -- what a caller uses -----------------------------------------------------------------

    @property
    def next_sequence(self) -> int:
        """The sequence id the next :meth:`send` uses unless given one."""
        return self._next

    @property
    def durable(self) -> int:
        """Every sequence id below this is in Kafka."""
        return self._durable

    @property
    def connected(self) -> bool:
        """Whether the stream is open on a connection now (False while reconnecting)."""
        return self._ready

    @property
    def pending(self) -> int:
        """Messages sent and not yet acknowledged."""
        return len(self._kept)

    async def start(self) -> int:
        """Connects; returns the sequence id the stream resumes from."""
        if self._runner is not None:
            raise RuntimeError("start() was called already")
        self._loop = asyncio.get_running_loop()
        self._started = self._loop.create_future()
        self._runner = asyncio.create_task(self._run())
        await self._started
        return self._next

    async def send(
        self,
        body: bytes,
        *,
        group_id: str | None = None,
        sequence_id: int | None = None,
        headers: Mapping[str, str] | None = None,
        content_type: str | None = None,
        traceparent: str | None = None,
        tracestate: str | None = None,
    ) -> int:
        """Sends one message; returns its sequence id once it is on its way (not yet durable:
        see :meth:`flush`). Waits while the server grants no credit. ``headers`` are ``X_*``
        headers for the webhook, as with HTTP produce, and the Content-Type and W3C trace
        context travel with the message too (docs/streaming.md, "Headers")."""
        key = group_id.encode() if group_id is not None else None
        block = header_block(headers, content_type, traceparent, tracestate)
        while True:
            with self._lock:
                sent = self._enqueue(key, body, block, sequence_id)
            if sent is not None:
                break
            await self._wait(lambda: self._ready and self._credits > 0)
        outbox, writer = self._outbox, self._writer
        if len(outbox) >= _OUTBOX_FRAMES and writer is not None:
            self._write_outbox(outbox)
            await writer.drain()
        return sent

    def _enqueue(
        self,
        key: bytes | None,
        body: bytes,
        block: tuple[tuple[bytes, bytes], ...] | None,
        sequence_id: int | None,
    ) -> int | None:
        """With the lock held: a MESSAGE with the next id (or ``sequence_id``), a credit spent
        on it, kept until acknowledged and put in the outbox; None when the stream is not
        open or has no credit. Frames enqueued before the loop next runs leave in one write:
        one system call, and for a sending thread one wake-up of the loop, for many."""
        if sequence_id is not None and sequence_id < self._next:
            raise ValueError(f"sequence ids must increase: {sequence_id} < {self._next}")
        if self._fatal is not None:
            raise self._fatal
        if not (self._ready and self._credits > 0):
            return None
        if sequence_id is None:
            sequence_id = self._next
        frame = frames.message_frame(self.stream_id, sequence_id, key, body, block)
        self._next = sequence_id + 1
        self._kept.append((sequence_id, frame))
        self._credits -= 1
        outbox = self._outbox
        outbox.append(frame)
        if len(outbox) == 1:
            loop = self._loop
            assert loop is not None
            if self._on_change is None:  # sent on the loop's own thread
                loop.call_soon(self._write_outbox, outbox)
            else:
                loop.call_soon_threadsafe(self._write_outbox, outbox)
        return sequence_id

    def _write_outbox(self, outbox: list[bytes]) -> None:
        """Writes the frames :meth:`send` gathered in ``outbox``, unless they were written
        already or the connection they were meant for is gone: then they are dropped (each is
        kept until acknowledged, and goes again after a reconnect)."""
        with self._lock:
            if outbox is not self._outbox:
                return
            self._outbox = []
            writer = self._writer
        if writer is not None:
            writer.write(b"".join(outbox))
            self._sent += 1

    async def flush(self) -> None:
        """Returns when Kafka holds every message sent so far."""
        await self._wait(lambda: not self._kept)

    async def close(self) -> None:
        """Flushes, ends the stream (EOS_MESSAGE) and the connection. Once it returns, another
        producer may open the stream at once (unless the connection was lost meanwhile: then
        the server frees it when Kafka has reported the last writes)."""
        if self._runner is None:
            return
        try:
            if self._fatal is None:
                await self.flush()
                if self._ready and self._writer is not None:
                    last = max(self._next - 1, 0)
                    self._closing = True  # no reconnect from here on
                    self._eos_sent = True
                    self._writer.write(frames.encode(frames.EosMessage(self.stream_id, last)))
                    with contextlib.suppress(OSError):
                        await self._writer.drain()
                    # The server answers EOS_MESSAGE with the stream's last ACK once another
                    # session may write the stream; waited for, unless the connection ends.
                    with contextlib.suppress(TimeoutError, StreamError):
                        await asyncio.wait_for(
                            self._wait(lambda: self._eos_acked or not self._ready),
                            self._connect_timeout_s,
                        )
        finally:
            self._closing = True
            self._runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._runner
            self._runner = None

    def reconnect(self, *, reset: bool = False) -> None:
        """Drops the connection (with a RST when ``reset``, else a FIN) and opens another, as
        after a lost one: to move to another replica behind a load balancer, or to test that
        a dropped connection loses nothing. Kept messages go again from the new point."""
        writer = self._writer
        if writer is None:
            return
        if reset:
            sock = writer.get_extra_info("socket")
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_ZERO)
            writer.transport.abort()
        else:
            writer.close()

    # -- the connection ---------------------------------------------------------------------

    async def _wait(self, ready: Any) -> None:
        while True:
            if self._fatal is not None:
                raise self._fatal
            if ready():
                return
            self._changed.clear()
            await self._changed.wait()

    def _wake(self) -> None:
        self._changed.set()
        if self._on_change is not None:
            self._on_change()

    async def _run(self) -> None:
        attempt = 0
        lost_at: float | None = None
        loop = asyncio.get_running_loop()
        while not self._closing:
            try:
                reader = await self._connect()
                attempt, lost_at = 0, None
                await self._read(reader)
            except StreamError as exc:
                self._fatal = exc
            except (_Reconnect, OSError, asyncio.IncompleteReadError, TimeoutError) as exc:
                log.warning("stream %s: %s; reconnecting", self.stream_name, exc or type(exc))
            except frames.FrameError as exc:
                self._fatal = StreamError("protocol_error", str(exc))
            finally:
                with self._lock:
                    self._ready = False
                    writer, self._writer = self._writer, None
                    self._outbox = []  # kept: they go again after the reconnect
                if writer is not None:
                    writer.close()
                self._wake()
            if self._fatal is not None:
                if self._started is not None and not self._started.done():
                    self._started.set_exception(self._fatal)
                return
            lost_at = lost_at or loop.time()
            give_up = self._backoff.give_up_s
            if give_up is not None and loop.time() - lost_at > give_up:
                self._fatal = StreamError("dependency_unavailable", "could not reconnect in time")
                self._wake()
                if self._started is not None and not self._started.done():
                    self._started.set_exception(self._fatal)
                return
            await asyncio.sleep(self._backoff.delay(attempt))
            attempt += 1
            self.reconnects += 1

    async def _connect(self) -> _FrameSource:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(self.host, self.port), self._connect_timeout_s
        )
        self._writer = writer
        source = _FrameSource(reader, frames.FrameReader(self._max_frame_bytes))
        writer.write(frames.encode(self._hello))
        sock = writer.get_extra_info("socket")
        if sock is not None:
            keep_alive(sock, _IDLE_TIMEOUT_S)
        ok = await asyncio.wait_for(source.next(), self._connect_timeout_s)
        if not isinstance(ok, frames.Ok):
            raise _unexpected(ok, "OK")
        self._idle_s = _idle_timeout(ok)
        with self._lock:
            self._credits = ok.initial_credits - 1
        name = self.stream_name.encode()
        writer.write(frames.encode(frames.Notify(self.stream_id, name, self._durable)))
        answer = await asyncio.wait_for(source.next(), self._connect_timeout_s)
        while isinstance(answer, frames.Ack):  # a server may return credits first
            self._on_frame(answer)
            answer = await asyncio.wait_for(source.next(), self._connect_timeout_s)
        if not isinstance(answer, frames.NotifyAck):
            raise _unexpected(answer, "NOTIFY_ACK")
        if not answer.success:
            # Another session writes the stream: an old session of this producer still waiting
            # for Kafka's last reports, or another producer with this id.
            raise _Reconnect(f"stream {self.stream_name} is open in another session")
        self._resume_at(answer.point_of_reference)
        # What the server does not hold goes again, before anything new.
        # (Nothing else sends while the stream is not ready.)
        for _, message in list(self._kept):
            while self._credits <= 0:
                self._on_frame(await source.next())
            with self._lock:
                self._credits -= 1
            writer.write(message)
            await writer.drain()
        with self._lock:
            self._ready = True
        if self._started is not None and not self._started.done():
            self._started.set_result(None)
        self._wake()
        return source

    def _resume_at(self, point: int) -> None:
        if point > self._next and self._kept:
            log.warning(
                "stream %s: the server holds up to %d, beyond what this producer sent (%d)",
                self.stream_name,
                point,
                self._next,
            )
        with self._lock:
            self._durable = max(self._durable, point)
            self._next = max(self._next, point)
            while self._kept and self._kept[0][0] < point:
                self._kept.popleft()

    async def _read(self, source: _FrameSource) -> None:
        assert self._writer is not None
        keeper = asyncio.create_task(self._keep_alive(self._writer))
        try:
            while True:
                self._on_frame(await source.next())
        finally:
            keeper.cancel()

    async def _keep_alive(self, writer: asyncio.StreamWriter) -> None:
        """Keeps an idle session from the server's idle timeout with a BOUNDARY MESSAGE every
        third of it when nothing else went out; ends a connection on which the server has said
        nothing for the idle timeout (twice that while messages wait for Kafka): a server
        that stopped (SIGSTOP, a host that froze) then holds the stream no longer than its
        lease, and this producer moves on."""
        every = self._idle_s / 3
        boundary = frames.encode(frames.Message(self.stream_id, frames.EPHEMERAL | frames.BOUNDARY))
        loop = asyncio.get_running_loop()
        sent, heard, heard_at = self._sent, self._heard, loop.time()
        while True:
            await asyncio.sleep(every)
            if self._heard != heard:
                heard, heard_at = self._heard, loop.time()
            silence = self._idle_s * (2 if self._kept else 1)
            if loop.time() - heard_at > silence:
                log.warning(
                    "stream %s: the server said nothing for %.0f s; reconnecting",
                    self.stream_name,
                    loop.time() - heard_at,
                )
                writer.transport.abort()
                return
            with self._lock:
                idle = self._sent == sent and self._ready and self._credits > 0
                if idle and not self._closing:
                    self._credits -= 1
            if idle and not self._closing:
                writer.write(boundary)
                self._sent += 1
            sent = self._sent

    def _on_frame(self, frame: frames.Frame) -> None:
        self._heard += 1
        if isinstance(frame, frames.Ack):
            moved = 0
            with self._lock:
                self._credits += frame.credits
                for stream_id, point in frame.acks:
                    if stream_id != self.stream_id:
                        continue
                    self._eos_acked = self._eos_sent
                    if point > self._durable:
                        moved = self._durable = point
                        while self._kept and self._kept[0][0] < point:
                            self._kept.popleft()
            if moved and self._on_durable is not None:
                self._on_durable(moved)
            self._wake()
        elif isinstance(frame, frames.Restart):
            raise _Reconnect("the server restarts")
        elif isinstance(frame, frames.Error):
            code, _, message = frame.reason.decode(errors="replace").partition(": ")
            if code in RETRYABLE:
                raise _Reconnect(f"{code}: {message}")
            raise StreamError(code, message or code)
        else:
            raise _unexpected(frame, "ACK")


def _idle_timeout(ok: frames.Ok) -> float:
    """The server's idle timeout, from OK's ``idle_timeout_ms`` pair."""
    for name, value in ok.pairs:
        if name == b"idle_timeout_ms" and value.isdigit() and int(value) > 0:
            return int(value) / 1000
    return _IDLE_TIMEOUT_S


class _FrameSource:
    """Frames from a connection, one at a time."""

    def __init__(self, reader: asyncio.StreamReader, cutter: frames.FrameReader) -> None:
        self._reader = reader
        self._cutter = cutter
        self._ready: deque[frames.Frame] = deque()

    async def next(self) -> frames.Frame:
        while not self._ready:
            data = await self._reader.read(_READ_BYTES)
            if not data:
                raise _Reconnect("the server closed the connection")
            self._ready.extend(self._cutter.feed(data))
        return self._ready.popleft()


def _unexpected(frame: frames.Frame, wanted: str) -> Exception:
    if isinstance(frame, frames.Error):
        code, _, message = frame.reason.decode(errors="replace").partition(": ")
        if code in RETRYABLE:
            return _Reconnect(f"{code}: {message}")
        return StreamError(code, message or code)
    if isinstance(frame, frames.Restart):
        return _Reconnect("the server restarts")
    return StreamError("protocol_error", f"expected {wanted}, got {type(frame).__name__}")


class StreamProducer:
    """:class:`AsyncStreamProducer` for code without an event loop: it runs one of its own in
    a background thread. :meth:`send` puts the message in the outbox from the caller's thread
    and returns without waiting for that thread (it waits only for a credit); the loop's
    thread writes what the sends gathered, woken once per write, not once per send. Every
    other method blocks until done. Same arguments; callers may send from several threads."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._producer: AsyncStreamProducer = self._call(self._make(args, kwargs))
        self._changed = threading.Condition(self._producer._lock)
        self._producer._on_change = self._notify

    async def _make(self, args: Any, kwargs: Any) -> AsyncStreamProducer:
        return AsyncStreamProducer(*args, **kwargs)

    def _call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def _notify(self) -> None:
        with self._changed:
            self._changed.notify_all()

    @property
    def next_sequence(self) -> int:
        return self._producer.next_sequence

    @property
    def durable(self) -> int:
        return self._producer.durable

    def start(self) -> int:
        return self._call(self._producer.start())

    def send(
        self,
        body: bytes,
        *,
        group_id: str | None = None,
        sequence_id: int | None = None,
        headers: Mapping[str, str] | None = None,
        content_type: str | None = None,
        traceparent: str | None = None,
        tracestate: str | None = None,
    ) -> int:
        producer = self._producer
        key = group_id.encode() if group_id is not None else None
        block = header_block(headers, content_type, traceparent, tracestate)
        with self._changed:
            while (sent := producer._enqueue(key, body, block, sequence_id)) is None:
                self._changed.wait()
        return sent

    def flush(self) -> None:
        self._call(self._producer.flush())

    def close(self) -> None:
        try:
            self._call(self._producer.close())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._loop.close()

    def __enter__(self) -> StreamProducer:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
