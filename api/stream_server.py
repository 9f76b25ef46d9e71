"""Streaming produce: the TCP listener ``setu api`` serves on ``SETU_STREAM_PORT``.

The wire format is docs/design.md §11 (setu/stream/frames.py); what Setu makes of it, and why
the listener lives in ``setu api``, is docs/streaming.md. In short:

- **Connections.** Before its session opens a connection costs almost nothing. The listener
  accepts it itself and reads its bare socket (:class:`Greeting`): the first frame must be HELLO,
  at most :data:`HELLO_MAX_BYTES`, refused from its length alone when longer, and due within
  ``SETU_STREAM_HELLO_TIMEOUT_MS``; nothing after it is read until the key is accepted.
  Connections without a session are capped apart from sessions (``SETU_STREAM_MAX_PENDING``,
  :class:`Admission`): past the cap the one that has waited longest for its HELLO is closed, so
  idle sockets neither take sessions' slots nor keep a producer that says HELLO at once from
  connecting. Refusals are counted, and logged at most once per 10 s (:class:`RefusalLog`).
- **Session.** HELLO's cookie is an API key with the produce permission. A replica serves
  ``SETU_STREAM_MAX_SESSIONS`` sessions, ``SETU_STREAM_MAX_SESSIONS_PER_KEY`` of one key. OK
  grants ``SETU_STREAM_CREDITS`` credits. Every MESSAGE and NOTIFY spends one; a session that
  spends more than it holds is ended.
- **Streams.** NOTIFY names ``{project}/{topic}/{producer_id}``. The session takes the stream's
  lease in Redis (one writer per stream over every replica, state/stream_sessions.py) and answers
  NOTIFY_ACK with the point to resume from; a stream another session writes gets success 0. A
  session holds at most ``SETU_STREAM_MAX_STREAMS_PER_SESSION`` streams.
- **Messages.** A MESSAGE is validated as HTTP produce validates it (its id is the producer's
  sequence id, its key the GroupId) and written to the topic's ingest topic as HTTP produce
  writes it, with the Setu message id ``{producer_id}:{sequence_id}``. One below the point the
  stream resumed from is a duplicate and is dropped here. An invalid one gets ERROR naming it,
  and nothing after it is written.
- **Credits and points.** A message's credit comes back only when Kafka acknowledged its write;
  ACK frames carry the credits and, per stream, the point of reference: every lower sequence id
  is in Kafka. Written bytes not yet acknowledged are capped over all sessions
  (``SETU_STREAM_BUFFER_BYTES``): past it no session is read, so memory stays bounded however
  slow the broker is.
- **Endings.** EOS_MESSAGE closes a stream once its writes are acknowledged. A Kafka failure or
  a lost lease ends the session with ERROR. On shutdown every session gets its last ACK, then
  RESTART. However a session ends, its leases are released only after Kafka reported every write
  it started, so the next writer of a stream never races the last one's writes.

ERROR reasons read ``"<code>: <message>"`` with the codes of the HTTP API's errors plus
``protocol_error``; ``setu.client`` retries ``dependency_unavailable``, ``rate_limited`` and
``internal`` and gives up on the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import secrets
import socket
import time
from collections import Counter, deque
from collections.abc import (
    Awaitable,
    Callable,
    Coroutine,
    Hashable,
    Iterable,
    Iterator,
    KeysView,
)
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, cast

from redis.exceptions import RedisError

from api.context import Services
from api.messages import (
    incarnation_for,
    ingest_headers,
    schedule_limit_ms,
    streamed_headers,
    trace_headers,
)
from api.producer import Reports
from api.topic_cache import CachedTopic
from setu import headers as rules
from setu import tracing
from setu.access import Permission, Principal, check, check_role
from setu.clock import now_ms
from setu.envelope import KafkaHeaders, kafka_key
from setu.errors import (
    InvalidInput,
    PayloadTooLarge,
    RateLimited,
    SetuError,
)
from setu.settings import Settings
from setu.stream import frames
from setu.stream.tcp import keep_alive
from state.producer_marks import MarksUnavailable
from state.stream_sessions import StreamKey, StreamSessions

log = logging.getLogger(__name__)

PROTOCOL_ERROR = "protocol_error"
# The first frame, HELLO, is four short fields of which only the API key matters: nothing longer
# is read from a caller not yet known.
HELLO_MAX_BYTES = 4096
_REFUSALS_LOGGED_EVERY_S = 10.0
_BACKLOG = 100  # asyncio's default
_TOO_MANY_WAITING = "too many streaming connections are waiting to say HELLO; retry later"
_TOO_MANY_WAITING_ERROR = f"dependency_unavailable: {_TOO_MANY_WAITING}".encode()
# Leases are renewed, points recorded and the key checked again this often (at most).
_KEEP_EVERY_S = 1.0
# How long a NOTIFY waits for a session of this replica to release the stream (Session._open).
_HANDOVER_S = 2.0
# How long an ending session waits for its helper tasks to stop.
_HELPERS_STOP_S = 1.0
# A message's id is a sequence id: 0..2^63-1 (docs/design.md §2).
_MAX_SEQUENCE = 2**63 - 1
# Room for a MESSAGE's fields and key besides its payload, in the default frame limit.
_FRAME_ROOM = 64 * 1024 + 64
# What a read hands the session's task: a write to await, a frame to handle, the read's frames
# after them.
_Handed = tuple[Awaitable[None] | None, frames.Frame | None, Iterator[frames.Frame]]


@dataclass(frozen=True, slots=True)
class StreamConfig:
    host: str
    port: int
    credits: int
    max_frame_bytes: int
    buffer_bytes: int
    max_sessions: int
    lease_ms: int
    ack_delay_s: float = 0.0


def stream_config(
    host: str,
    port: int,
    *,
    credits: int,
    max_frame_bytes: int | None,
    max_message_bytes: int,
    buffer_bytes: int,
    max_sessions: int,
    lease_ms: int,
    ack_delay_ms: int = 0,
) -> StreamConfig:
    """The listener's settings; the frame limit defaults to the largest message plus room."""
    return StreamConfig(
        host,
        port,
        credits,
        max_frame_bytes or max_message_bytes + _FRAME_ROOM,
        buffer_bytes,
        max_sessions,
        lease_ms,
        ack_delay_ms / 1000,
    )


class Refused(Exception):
    """Ends a session with ERROR ``"<code>: <message>"``."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code


def refusal(exc: SetuError, prefix: str = "") -> Refused:
    return Refused(exc.code, f"{prefix}{exc.message}")


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """What one caller may hold of the listener (docs/streaming.md, "What a caller may hold")."""

    hello_timeout_s: float
    idle_timeout_s: float
    max_pending: int
    max_sessions: int
    max_sessions_per_key: int
    max_streams_per_session: int


def connection_limits(settings: Settings, max_sessions: int) -> ConnectionLimits:
    """The limits from the ``SETU_STREAM_*`` settings; one key's sessions default to a quarter
    of ``max_sessions``."""
    per_key = settings.stream_max_sessions_per_key
    return ConnectionLimits(
        hello_timeout_s=settings.stream_hello_timeout_ms / 1000,
        idle_timeout_s=settings.stream_idle_timeout_ms / 1000,
        max_pending=settings.stream_max_pending,
        max_sessions=max_sessions,
        max_sessions_per_key=per_key if per_key is not None else max(1, max_sessions // 4),
        max_streams_per_session=settings.stream_max_streams_per_session,
    )


C = TypeVar("C", bound=Hashable)


class Admission(Generic[C]):
    """Which connections are served: bookkeeping only, the listener does the I/O.

    A connection is *pending* from its arrival until its session opens: first reading its
    HELLO, then while its key is checked. At most ``max_pending`` are pending, whatever the
    sessions. A connection over that cap turns away the one that has waited longest for its
    HELLO (a client that means to talk sends it at once, so the oldest is the likeliest idle),
    or itself when every pending one has sent its HELLO already. Sessions count apart: at most
    ``max_sessions``, ``max_sessions_per_key`` of one key."""

    def __init__(self, limits: ConnectionLimits) -> None:
        self.limits = limits
        self._reading: dict[C, None] = {}  # no whole HELLO yet, oldest first
        self._checking: set[C] = set()  # HELLO read, its key being checked
        self._opened: dict[C, str] = {}  # session -> its key's id
        self._per_key: Counter[str] = Counter()

    @property
    def pending(self) -> int:
        return len(self._reading) + len(self._checking)

    @property
    def opened(self) -> KeysView[C]:
        return self._opened.keys()

    def reading(self) -> KeysView[C]:
        """The connections still reading their HELLO, oldest first."""
        return self._reading.keys()

    def arrive(self, connection: C) -> C | None:
        """Counts a new connection; returns the connection to turn away, if any."""
        if self.pending < self.limits.max_pending:
            self._reading[connection] = None
            return None
        if not self._reading:
            return connection
        oldest = next(iter(self._reading))
        del self._reading[oldest]
        self._reading[connection] = None
        return oldest

    def greeted(self, connection: C) -> None:
        """Its HELLO is whole: it may no longer be turned away for a newer connection."""
        if connection in self._reading:
            del self._reading[connection]
            self._checking.add(connection)

    def open(self, connection: C, key_id: str) -> Refused | None:
        """Opens its session for the key ``key_id``, or says why not."""
        self._checking.discard(connection)
        limits = self.limits
        if len(self._opened) >= limits.max_sessions:
            return Refused("dependency_unavailable", "too many streaming sessions; retry later")
        if self._per_key[key_id] >= limits.max_sessions_per_key:
            return Refused(
                "rate_limited",
                f"this API key holds {limits.max_sessions_per_key} streaming sessions on this "
                "replica, the most one key may; end one or retry later",
            )
        self._opened[connection] = key_id
        self._per_key[key_id] += 1
        return None

    def leave(self, connection: C) -> None:
        """The connection is closed (it may be in any state, or counted no more)."""
        self._reading.pop(connection, None)
        self._checking.discard(connection)
        key_id = self._opened.pop(connection, None)
        if key_id is not None:
            self._per_key[key_id] -= 1
            if not self._per_key[key_id]:
                del self._per_key[key_id]


class RefusalLog:
    """Connections refused before their session opened. Each is logged at DEBUG, and one
    WARNING at most every ``every_s`` counts them by code: refusals cost a caller nothing, so
    they must not flood the log. ``setu_api_stream_session_ends_total{how="refused"}`` counts
    every one."""

    def __init__(
        self,
        every_s: float = _REFUSALS_LOGGED_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._every_s = every_s
        self._clock = clock
        self._logged_at = -math.inf
        self._codes: Counter[str] = Counter()

    def note(self, peer: str, reason: str) -> None:
        log.debug("streaming connection %s refused: %s", peer, reason)
        self._codes[reason.partition(":")[0]] += 1
        now = self._clock()
        if now - self._logged_at < self._every_s:
            return
        self._logged_at = now
        counts = ", ".join(f"{n} {code}" for code, n in sorted(self._codes.items()))
        self._codes.clear()
        log.warning(
            "streaming connections refused before a session opened: %s "
            "(since the last such line; each one at DEBUG)",
            counts,
        )


def parse_stream_name(name: bytes) -> StreamKey:
    """``{project}/{topic}/{producer_id}`` as its three parts; InvalidInput otherwise."""
    try:
        text = name.decode()
    except UnicodeDecodeError:
        raise InvalidInput("a stream name is UTF-8 text") from None
    parts = text.split("/")
    if len(parts) != 3 or not all(parts):
        raise InvalidInput(
            f"a stream name is {{project}}/{{topic}}/{{producer_id}}, not {text[:200]!r}"
        )
    project, topic, producer = parts
    rules.check_id(rules.PRODUCER_ID, producer, required=True)
    return project, topic, producer


def check_message(frame: frames.Message, grouped: bool, max_bytes: int) -> tuple[str | None, bytes]:
    """A MESSAGE's GroupId and body, under the rules of HTTP produce; raises SetuError. Its
    header block, if any, is :func:`api.messages.streamed_headers`'s."""
    assert frame.message_id is not None
    if frame.message_id > _MAX_SEQUENCE:
        raise InvalidInput(f"the id is a sequence id, at most {_MAX_SEQUENCE}")
    group_id = None
    if frame.key is not None:
        try:
            group_id = frame.key.decode()
        except UnicodeDecodeError:
            raise InvalidInput("the key (GroupId) is not UTF-8 text") from None
    group_id = rules.check_id(rules.GROUP_ID, group_id, required=grouped)
    body = frame.payload or b""
    if len(body) > max_bytes:
        raise PayloadTooLarge(f"the payload is over the limit of {max_bytes} bytes")
    return group_id, body


def _named(frame: frames.Message) -> str:
    return f"stream {frame.stream_id} message {frame.message_id}"


class PointTracker:
    """Where one stream stands: sequence ids go out in increasing order and come back in any
    order; ``point`` is one more than the highest id below which every id that went out came
    back acknowledged."""

    __slots__ = ("_acked", "_out", "point")

    def __init__(self, point: int) -> None:
        self.point = point
        self._out: deque[int] = deque()
        self._acked: set[int] = set()

    def __len__(self) -> int:
        """Ids out and not yet reported."""
        return len(self._out) - len(self._acked)

    def sent(self, sequence: int) -> None:
        self._out.append(sequence)

    def acked(self, sequence: int) -> bool:
        """Records an acknowledgement; True when the point moved."""
        out, acked = self._out, self._acked
        if out and out[0] == sequence:
            out.popleft()
        else:
            acked.add(sequence)
            return False
        last = sequence
        while out and out[0] in acked:
            last = out.popleft()
            acked.discard(last)
        self.point = out[0] if out else last + 1
        return True

    def skip(self, point: int) -> None:
        """Nothing is out: the point moves to ``point`` (ids below it are durable already)."""
        if not self._out and point > self.point:
            self.point = point


class _Stream(Reports):
    """One open stream of a session; Kafka's reports of its writes arrive at :meth:`settle`."""

    def __init__(
        self,
        session: Session,
        stream_id: int,
        key: StreamKey,
        entry: CachedTopic,
    ) -> None:
        self.session = session
        self.stream_id = stream_id
        self.key = key
        self.project, self.topic, self.producer = key
        self.entry = entry
        self.incarnation = incarnation_for(self.producer, entry.topic.created_at_ms)
        self.written: dict[int, tuple[int, float]] = {}  # sequence -> (bytes, perf_counter)
        self.closing = False
        self.released = asyncio.Event()
        self.ok = 0  # writes Kafka acknowledged, not yet added to the metrics
        self.start_at(0)

    def start_at(self, point: int) -> None:
        """The stream resumes at ``point`` (NOTIFY_ACK): every lower sequence is durable."""
        self.resumed_at = point
        self.last_id = point - 1
        self.tracker = PointTracker(point)
        self.told = point  # the point the client last heard
        self.recorded = point  # the point last recorded in Redis

    def settle(self, index: int, error: str | None) -> None:
        self.session.reported(self, index, error)

    def settled(self) -> None:
        self.session.answer_reports()


class Greeting:
    """One connection before its session opens, on its bare socket: the listener reads its
    HELLO and not a byte more (a caller not yet known makes it hold at most HELLO_MAX_BYTES;
    what else it sends waits in the kernel), and writes it nothing but ERROR or RESTART."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        try:
            self.peer = str(sock.getpeername())
        except OSError:
            self.peer = "(gone)"
        self.received = bytearray()  # the HELLO frame, as far as it came
        self.task: asyncio.Task[None] | None = None
        self.session: Session | None = None
        self.stopped_as: str | None = None  # how it was ended from outside

    async def hello(self, admission: Admission[Greeting]) -> frames.Hello:
        """The first frame, whole; its length is checked before its body is read."""
        await self._receive(4)
        length = int.from_bytes(self.received[:4], "big")
        if length > HELLO_MAX_BYTES:
            raise Refused(
                PROTOCOL_ERROR,
                f"the first frame (HELLO) may be at most {HELLO_MAX_BYTES} bytes, not {length}",
            )
        await self._receive(4 + length)
        admission.greeted(self)
        first = frames.decode(bytes(self.received[4:]))
        self.received = bytearray()
        if not isinstance(first, frames.Hello):
            raise Refused(PROTOCOL_ERROR, "the first frame must be HELLO")
        return first

    async def _receive(self, size: int) -> None:
        loop = asyncio.get_running_loop()
        while len(self.received) < size:
            data = await loop.sock_recv(self.sock, size - len(self.received))
            if not data:
                raise ConnectionError("the client closed the connection")
            self.received += data

    def send(self, frame: frames.Frame) -> None:
        """Writes a small frame as far as the socket takes it at once, which never waits."""
        with contextlib.suppress(OSError):
            self.sock.send(frames.encode(frame))

    def stop(self, how: str, frame: frames.Frame) -> None:
        """Ends it from outside (turned away, or shutdown): ``frame``, then the end."""
        self.stopped_as = how
        self.send(frame)
        if self.task is not None and self.task is not asyncio.current_task():
            self.task.cancel()


class _Connection(asyncio.Protocol):
    """A session's socket once its key is accepted. The bytes a read brings go straight to
    :meth:`Session.received`, on the event loop's read callback: a MESSAGE that needs no wait
    is written there and then, with no task wake-up per read (what most of a low-rate
    producer's cost was, docs/streaming.md "Cost"). Reading pauses whenever the session has
    something to await; unread bytes then wait in the kernel, not here."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.session: Session | None = None
        self.closed = False  # the client's EOF, or the connection lost
        self._paused = True  # reading; the session resumes it once it runs
        self._writing_paused = False
        self._drained: asyncio.Future[None] | None = None

    # -- asyncio.Protocol --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # (uvloop's transports are not asyncio.Transport subclasses, but have its methods)
        self.transport = cast(asyncio.Transport, transport)
        self.transport.pause_reading()  # nothing is read before the session runs

    def data_received(self, data: bytes) -> None:
        if self.session is not None:
            self.session.received(data)

    def eof_received(self) -> bool:
        self._close()
        return True  # half-closed: the session still writes its last ACK, then closes

    def connection_lost(self, exc: Exception | None) -> None:
        self._close()
        self._wake_drain()

    def pause_writing(self) -> None:
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        self._wake_drain()

    # -- the session's side ------------------------------------------------------------------

    def pause(self) -> None:
        if not self._paused and self.transport is not None and not self.transport.is_closing():
            self._paused = True
            self.transport.pause_reading()

    def resume(self) -> None:
        if self._paused and self.transport is not None and not self.transport.is_closing():
            self._paused = False
            self.transport.resume_reading()

    def write(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.write(data)

    def is_closing(self) -> bool:
        return self.transport is None or self.transport.is_closing()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    async def drain(self) -> None:
        """Returns once the transport's write buffer is below its high-water mark, or the
        connection is gone (what is left unsent then is lost with it)."""
        if not self._writing_paused or self.closed:
            return
        if self._drained is None:
            self._drained = asyncio.get_running_loop().create_future()
        await asyncio.shield(self._drained)

    def _wake_drain(self) -> None:
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)
        self._drained = None

    def _close(self) -> None:
        self.closed = True
        if self.session is not None:
            self.session.wake_reader()


class Session:
    """One connection once its key is accepted: OK, then frames until EOF, ERROR, RESTART or a
    failure."""

    def __init__(
        self,
        server: StreamServer,
        connection: _Connection,
        greeting: Greeting,
        hello: frames.Hello,
        who: Principal,
    ) -> None:
        self.server = server
        self.s = server.services
        self.writer = connection
        connection.session = self
        self.peer = greeting.peer
        self.token = f"{server.replica}/{secrets.token_hex(16)}"
        self.frames = frames.FrameReader(server.config.max_frame_bytes)
        self.streams: dict[int, _Stream] = {}
        self.who = who
        self.cookie = hello.cookie.decode()
        self.hello = hello
        self.available = 0  # credits the client holds, as far as this side knows
        self.owed = 0  # credits earned and not yet sent in an ACK
        self.wake = asyncio.Event()
        self._ack_due = False  # an ACK waits for the listener's next ACK round
        self.error: str | None = None
        self.restarting = False
        self.timed_out = False
        self.ending = False
        self.task: asyncio.Task[None] | None = None
        self.written = 0
        self.duplicates = 0
        self.clock = asyncio.get_running_loop().time
        # Since when the session has been waiting for the client's next bytes (while
        # ``reading``): idle longer than the listener's idle timeout, it is ended (the keeper).
        self.heard_at = self.clock()
        self.reading = False
        # What a read left for the session's task (reading is paused meanwhile): a write to
        # await, a frame to handle, the rest of the read's frames; or what it raised.
        self._handed: _Handed | None = None
        self._raised: BaseException | None = None
        self._later: list[bytes] = []
        self._busy = True  # the task has the read side (reading paused)
        self._reader_wake = asyncio.Event()

    # -- life cycle -------------------------------------------------------------------------

    async def run(self) -> None:
        how = "closed"
        self.task = asyncio.current_task()
        helpers: list[asyncio.Task[None]] = []
        try:
            self._send_ok()
            helpers = [asyncio.create_task(self._flush_forever())]
            await self._read_forever()
        except Refused as refused:
            how = "error"
            self._fail(str(refused))
        except frames.FrameError as exc:
            how = "error"
            self._fail(f"{PROTOCOL_ERROR}: {exc}")
        except (ConnectionError, asyncio.IncompleteReadError):
            how = "closed"
        except asyncio.CancelledError:
            # Stopped from outside: shutdown (RESTART), idle, or a failure already reported.
            how = "restart" if self.restarting else "idle" if self.timed_out else "error"
        except Exception:
            log.exception("streaming session %s failed", self.peer)
            how = "error"
            self._fail("internal: the server failed; reconnect")
        finally:
            self.ending = True
            await self._end(helpers)
            self.s.metrics.stream_session_ends.labels(how).inc()

    def stop(self) -> None:
        """Shutdown: stop reading; the session acknowledges what it wrote, then RESTART."""
        self.restarting = True
        self._stop_reading()

    def _stop_reading(self) -> None:
        self.writer.pause()
        # Only from outside the session's own task, and never once it is ending.
        if self.task is not None and not self.ending and self.task is not asyncio.current_task():
            self.task.cancel()

    def _send_ok(self) -> None:
        self.available = self.server.config.credits
        pairs = (
            (b"max_frame_bytes", str(self.server.config.max_frame_bytes).encode()),
            (b"max_message_bytes", str(self.s.settings.max_message_bytes).encode()),
            (b"idle_timeout_ms", str(round(self.server.limits.idle_timeout_s * 1000)).encode()),
        )
        self._send(frames.Ok(self.available, (), pairs))
        log.info(
            "streaming session %s opened by key %s (program %r, instance %r)",
            self.peer,
            self.who.key_id,
            self.hello.program.decode(errors="replace")[:100],
            self.hello.instance.decode(errors="replace")[:100],
        )

    async def _read_forever(self) -> None:
        """The session's task while it reads. Reading itself runs in :meth:`received`; the
        task owns the read side only while reading is paused (``_busy``): it awaits what a read
        handed over, waits for room under the buffer cap, and returns at the client's EOF."""
        server = self.server
        connection = self.writer
        while self.error is None:
            if self._raised is not None:
                raise self._raised
            handed, self._handed = self._handed, None
            if handed is not None:
                waiting, frame, rest = handed
                if waiting is not None:
                    await waiting
                if frame is not None and self.error is None:
                    await self._handle(frame)
                self._take(rest)
            elif self._later:
                later, self._later = b"".join(self._later), []
                self._busy = False
                self.received(later)
                self._busy = True
            elif server.buffered >= server.config.buffer_bytes:
                await server.room.wait()
            elif connection.closed:
                return
            else:
                self.heard_at, self.reading = self.clock(), True
                self._reader_wake.clear()
                self._busy = False
                connection.resume()
                await self._reader_wake.wait()
                self._busy, self.reading = True, False  # a hand-over, or the connection closed

    def received(self, data: bytes) -> None:
        """A read's bytes, on the loop's read callback: the frames they complete are handled
        here until one needs awaiting; that one and the rest go to the session's task, and
        reading pauses until it is done. Past the buffer cap reading pauses too."""
        if self.error is not None or self.restarting or self.ending:
            return  # a read after ERROR or shutdown is not acted on
        if self._busy:
            # Reading is paused while the task has the read side, so this is not expected;
            # kept, in order, for the task.
            self._later.append(data)
            return
        self.heard_at = self.clock()
        try:
            if (
                not self._take(self.frames.feed(data))
                and self.server.buffered >= self.server.config.buffer_bytes
            ):
                self._hand_over(None)
        except Exception as exc:
            self._raised = exc
            self._hand_over(None)

    def _take(self, received: Iterator[frames.Frame]) -> bool:
        """Handles ``received`` in order until a frame needs awaiting, or the session fails; a
        MESSAGE is written without a pause when nothing needs waiting for (the hot path: many
        arrive per read). True when that frame and the rest were handed to the task."""
        for frame in received:
            if self.error is not None:
                return False
            if type(frame) is frames.Message:
                self._spend()
                waiting = self._message(frame)
                if waiting is not None:
                    self._hand_over((waiting, None, received))
                    return True
            else:
                self._hand_over((None, frame, received))
                return True
        return False

    def _hand_over(self, handed: _Handed | None) -> None:
        self.writer.pause()
        self._busy, self.reading = True, False
        self._handed = handed
        self._reader_wake.set()

    def wake_reader(self) -> None:
        """The connection closed: the task ends the session once it handled what it has."""
        self._reader_wake.set()

    async def _end(self, helpers: list[asyncio.Task[None]]) -> None:
        """Waits for Kafka's reports of every write, tells the client where each stream stands
        (unless it was sent ERROR), records the points, releases the leases, closes."""
        deadline = time.monotonic() + self.s.producer.ack_timeout_s
        while any(stream.written for stream in self.streams.values()):
            if time.monotonic() > deadline:
                log.error("streaming session %s: Kafka did not report every write", self.peer)
                break
            self.wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), 0.05)
        for task in helpers:
            task.cancel()
        # Cancelled, and told by ``ending`` too: a cancellation can be lost inside a library
        # call. A keeper cancelled during its Redis calls was seen to carry on, renewing the
        # leases for 30 s while this waited for it (the stream stayed locked).
        _, stuck = await asyncio.wait(helpers, timeout=_HELPERS_STOP_S)
        if stuck:
            log.warning("streaming session %s: %d helper(s) did not stop", self.peer, len(stuck))
        if self.error is None and not self.writer.is_closing():
            self._ack()
            if self.restarting:
                self._send(frames.Restart())
        self._count_ok()
        for stream in list(self.streams.values()):
            self.server.forget_buffered(stream)
        await self._record_points()
        for stream in list(self.streams.values()):
            await self._release(stream)
        self.streams.clear()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.writer.drain(), 1.0)
        self.writer.close()
        log.info(
            "streaming session %s ended: %d written, %d duplicates dropped%s",
            self.peer,
            self.written,
            self.duplicates,
            f", {self.error}" if self.error else "",
        )

    def _fail(self, reason: str) -> None:
        """Sends ERROR (once); the session ends and writes nothing more."""
        if self.error is not None:
            return
        self.error = reason
        log.warning("streaming session %s: %s", self.peer, reason)
        self._send(frames.Error(reason.encode()[: frames.U16_MAX]))
        self.wake.set()
        self._stop_reading()

    def _send(self, frame: frames.Frame) -> None:
        if not self.writer.is_closing():
            self.writer.write(frames.encode(frame))

    # -- frames -----------------------------------------------------------------------------

    async def _handle(self, frame: frames.Frame) -> None:
        if isinstance(frame, frames.Notify):
            self._spend()
            await self._notify(frame)
        elif isinstance(frame, frames.EosMessage):
            self._eos(frame.stream_id)
        elif isinstance(frame, frames.Error):
            reason = frame.reason.decode(errors="replace")[:500]
            log.warning("streaming session %s: the client sent ERROR %r", self.peer, reason)
            raise ConnectionError("the client sent ERROR")
        else:
            name = type(frame).__name__.upper()
            raise Refused(PROTOCOL_ERROR, f"a client may not send {name} here")

    def _spend(self) -> None:
        if self.available <= 0:
            raise Refused(PROTOCOL_ERROR, "out of credits: wait for an ACK")
        self.available -= 1

    async def _notify(self, frame: frames.Notify) -> None:
        if frame.stream_id in self.streams:
            raise Refused(PROTOCOL_ERROR, f"stream {frame.stream_id} is already open")
        most = self.server.limits.max_streams_per_session
        if len(self.streams) >= most:
            # Streams end only once their writes are acknowledged: their last ACK frees them.
            raise Refused(
                "invalid_input",
                f"NOTIFY of stream {frame.stream_id}: a session may have {most} streams open at "
                "most; end one (EOS_MESSAGE, then its last ACK) first",
            )
        try:
            key = parse_stream_name(frame.name)
            check(self.who, Permission.PRODUCE, key[0], key[1])
            entry = await self.s.topics.get(key[0], key[1])
        except SetuError as exc:
            raise refusal(exc, f"NOTIFY of stream {frame.stream_id}: ") from None
        try:
            await self._open(frame, key, entry)
        finally:
            self._earn(1)  # after NOTIFY_ACK: its ACK follows it

    async def _open(self, frame: frames.Notify, key: StreamKey, entry: CachedTopic) -> None:
        if any(stream.key == key for stream in self.streams.values()):
            self._send(frames.NotifyAck(False, frame.stream_id, 0))
            return
        sessions: StreamSessions = self.server.sessions_store
        try:
            # Shielded: a lease taken must be recorded, or it would be held until its TTL.
            taken = await asyncio.shield(sessions.acquire(key, self.token))
            holder = self.server.holders.get(key)
            if not taken and holder is not None:
                # Held by a session of this replica: most often the producer's own last
                # connection, dropped and not yet ended (its writes still in flight). Its
                # release is awaited rather than refused, so the reconnect needs no retry.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(holder.released.wait(), _HANDOVER_S)
                taken = await asyncio.shield(sessions.acquire(key, self.token))
            if not taken:
                self._send(frames.NotifyAck(False, frame.stream_id, 0))
                log.info("stream %s is written by another session", "/".join(key))
                return
            stream = _Stream(self, frame.stream_id, key, entry)
            self.streams[frame.stream_id] = stream  # from here on, _end releases the lease
            self.server.holders[key] = stream
            stream.start_at(await sessions.resume_point(key, stream.incarnation))
        except (RedisError, OSError) as exc:
            raise Refused("dependency_unavailable", f"Redis: {exc}") from None
        except MarksUnavailable as exc:
            raise Refused("dependency_unavailable", str(exc)) from None
        self._send(frames.NotifyAck(True, frame.stream_id, stream.tracker.point))

    def _message(self, frame: frames.Message) -> Coroutine[Any, Any, None] | None:
        """Checks and writes one MESSAGE; returns what is left to await when the quota or a
        full local queue makes the session wait (None: done)."""
        stream = self.streams.get(frame.stream_id)
        if stream is None or stream.closing:
            raise Refused(PROTOCOL_ERROR, f"MESSAGE for stream {frame.stream_id}, not open")
        if frame.flags & frames.BOUNDARY:
            self._earn(1)  # carries no message
            return None
        sequence = frame.message_id
        if sequence is None:
            raise Refused("invalid_input", f"stream {frame.stream_id}: a MESSAGE needs an id")
        if sequence <= stream.last_id:
            if sequence < stream.resumed_at:
                # Durable already (below the point NOTIFY_ACK gave): a resend, dropped here.
                self.duplicates += 1
                self.s.metrics.count_produced(stream.project, stream.topic, "duplicate")
                self._earn(1)
                return None
            raise Refused(
                PROTOCOL_ERROR,
                f"{_named(frame)}: ids must increase (the last was {stream.last_id})",
            )
        try:
            group_id, body = check_message(
                frame, stream.entry.topic.grouped, self.s.settings.max_message_bytes
            )
        except SetuError as exc:
            self.s.metrics.count_produced(stream.project, stream.topic, "rejected")
            raise refusal(exc, f"{_named(frame)}: ") from None
        message_id = f"{stream.producer}:{sequence}"
        if frame.headers is None:
            headers = ingest_headers(
                message_id, group_id, stream.producer, sequence, (), now_ms(), stream.incarnation
            )
        else:
            headers = self._with_headers(stream, frame, message_id, group_id, sequence)
        headers = stream.entry.with_ingest_headers(headers)
        record = (stream.entry.ingest_topic, kafka_key(message_id, group_id), body, headers)
        if self.s.gate.admit_now(stream.project, 1, len(body)):
            try:
                if self.s.producer.submit_now(*record, stream, sequence):
                    self._written(stream, frame, len(body))
                    return None
            except SetuError as exc:
                raise self._not_written(stream, frame, exc) from None
            return self._write(stream, frame, record, admitted=True)
        return self._write(stream, frame, record, admitted=False)

    def _with_headers(
        self,
        stream: _Stream,
        frame: frames.Message,
        message_id: str,
        group_id: str | None,
        sequence: int,
    ) -> KafkaHeaders:
        """The ingest headers of a MESSAGE with a header block: its ``X_*`` headers,
        Content-Type and trace context, as HTTP produce writes them."""
        assert frame.headers is not None
        now = now_ms()
        try:
            given = streamed_headers(frame.headers)
            limit = schedule_limit_ms(stream.entry.topic, self.s.settings.max_delivery_delay_ms)
            deliver_at, extra = rules.scheduled_at(given.extra, now, limit)
        except SetuError as exc:
            self.s.metrics.count_produced(stream.project, stream.topic, "rejected")
            raise refusal(exc, f"{_named(frame)}: ") from None
        headers = ingest_headers(
            message_id,
            group_id,
            stream.producer,
            sequence,
            extra,
            now,
            stream.incarnation,
            given.content_type,
            deliver_at_ms=deliver_at,
        )
        return headers + trace_headers(
            *tracing.request_context(given.traceparent, given.tracestate)
        )

    async def _write(
        self,
        stream: _Stream,
        frame: frames.Message,
        record: tuple[str, bytes, bytes, KafkaHeaders],
        *,
        admitted: bool,
    ) -> None:
        """The MESSAGE's write when it must wait: for the quota, or for room in the queue."""
        topic, key, body, headers = record
        if not admitted:
            await self._admit(stream, len(body))
        assert frame.message_id is not None
        try:
            await self.s.producer.submit(topic, key, body, headers, stream, frame.message_id)
        except SetuError as exc:
            raise self._not_written(stream, frame, exc) from None
        self._written(stream, frame, len(body))

    def _written(self, stream: _Stream, frame: frames.Message, size: int) -> None:
        sequence = frame.message_id
        assert sequence is not None
        stream.last_id = sequence
        stream.tracker.sent(sequence)
        stream.written[sequence] = (size, time.perf_counter())
        self.server.add_buffered(size)
        self.written += 1
        if frame.flags & frames.EOS:
            self._eos(frame.stream_id)

    def _not_written(self, stream: _Stream, frame: frames.Message, exc: SetuError) -> Refused:
        self.s.metrics.count_produced(stream.project, stream.topic, "failed")
        return refusal(exc, f"{_named(frame)}: ")

    async def _admit(self, stream: _Stream, size: int) -> None:
        """The project's produce quota: over it, the session waits (back-pressure, no 429)."""
        while True:
            try:
                await self.s.gate.admit(stream.project, 1, size)
                return
            except RateLimited as exc:
                self.s.metrics.count_produced(stream.project, stream.topic, "throttled")
                await asyncio.sleep(min(max(exc.retry_after_s, 0.05), 1.0))

    def _eos(self, stream_id: int) -> None:
        stream = self.streams.get(stream_id)
        if stream is None or stream.closing:
            raise Refused(PROTOCOL_ERROR, f"EOS_MESSAGE for stream {stream_id}, not open")
        stream.closing = True
        self.wake.set()

    # -- Kafka's reports and what the client hears --------------------------------------------

    def reported(self, stream: _Stream, sequence: int, error: str | None) -> None:
        size, started = stream.written.pop(sequence, (0, 0.0))
        self.server.add_buffered(-size)
        if error is not None:
            self.s.metrics.count_produced(stream.project, stream.topic, "failed")
            self._fail(
                f"dependency_unavailable: stream {stream.stream_id} message {sequence} was not "
                f"written to Kafka ({error}); reconnect and resume from NOTIFY_ACK"
            )
            return
        stream.ok += 1
        self.s.metrics.observe_ack("stream", time.perf_counter() - started)
        stream.tracker.acked(sequence)
        self.owed += 1  # answered by answer_reports, after every report of this hand-over

    def answer_reports(self) -> None:
        """After a hand-over of Kafka's reports. The ACK waits up to the listener's ACK delay
        (``SETU_STREAM_ACK_DELAY_MS``) so that the reports of several rounds leave in one
        frame, unless the client is short of credits or a stream waits to end; it is written
        in the listener's ACK round (one timer for every session waiting), not by the flush
        task, so a report round costs no task wake-up (docs/streaming.md,
        "Acknowledgements"). The ACK frames a client leaves unread are bounded by its credits,
        so these writes need no drain."""
        if self.error is not None or self.ending:
            self.wake.set()  # _end waits for the last reports
            return
        if self._ack_due:
            return
        delay = self.server.config.ack_delay_s
        if (
            delay
            and self.available > self.server.config.credits // 4
            and not self._ending_streams()
        ):
            self._ack_due = True
            self.server.answer_soon(self)
        else:
            self._answer()

    def answer(self) -> None:
        """The listener's ACK round (StreamServer.answer_soon) came."""
        self._ack_due = False
        self._answer()

    def _answer(self) -> None:
        if self.error is not None or self.ending:
            return
        self._ack()
        if self._ending_streams():
            self.wake.set()

    def _ending_streams(self) -> bool:
        """Whether a stream EOS closed has all its writes acknowledged: the flush task ends
        it (that needs Redis)."""
        return any(stream.closing and not stream.written for stream in self.streams.values())

    def _earn(self, credits: int) -> None:
        self.owed += credits
        self.wake.set()

    def _ack(self) -> None:
        """One ACK with the credits earned and every point the client has not heard yet."""
        self._count_ok()
        moved = []
        for stream in self.streams.values():
            point = stream.tracker.point
            if point != stream.told:
                stream.told = point
                moved.append((stream.stream_id, point))
        if self.owed or moved:
            credits, self.owed = self.owed, 0
            self.available += credits
            self._send(frames.Ack(credits, tuple(moved)))

    def _count_ok(self) -> None:
        """Adds the acknowledged writes to the metrics: once per ACK, not once per message."""
        for stream in self.streams.values():
            if stream.ok:
                self.s.metrics.count_produced(stream.project, stream.topic, "ok", stream.ok)
                stream.ok = 0

    async def _flush_forever(self) -> None:
        while True:
            await self.wake.wait()
            self.wake.clear()
            if self.error is not None or self.ending:
                return
            self._ack()
            for stream in [s for s in self.streams.values() if s.closing and not s.written]:
                await self._close_stream(stream)
            await self.writer.drain()

    async def _close_stream(self, stream: _Stream) -> None:
        """EOS: every write is acknowledged; the stream is free for its next session. The last
        ACK goes out after the lease is released, so a client that waits for it may hand the
        stream on at once."""
        # Forgotten only once released: a session that ends meanwhile (the client closed the
        # connection right after EOS) releases it itself, where a lease half-released here
        # stayed held for its whole TTL.
        await self._record_points([stream])
        await self._release(stream)
        del self.streams[stream.stream_id]
        self._send(frames.Ack(0, ((stream.stream_id, stream.tracker.point),)))

    def kept(self, idle_s: float) -> bool:
        """The keeper's look at this session (StreamServer._keep_forever): False when it is
        ending, failed, or idle for longer than ``idle_s`` (then it is ended here)."""
        if self.ending or self.error is not None:
            return False
        if self._idle_for() > idle_s:
            self.timed_out = True
            self._fail(
                f"request_timeout: nothing from the client in {idle_s:g} s; an idle client "
                'sends a BOUNDARY MESSAGE (docs/streaming.md, "Idle sessions")'
            )
            return False
        return True

    async def check_key(self) -> None:
        """Ends the session when its key no longer may produce to one of its topics."""
        try:
            who = await self.s.auth.principal(f"Bearer {self.cookie}")
            for stream in list(self.streams.values()):
                check(who, Permission.PRODUCE, stream.project, stream.topic)
        except SetuError as exc:
            self._fail(f"{exc.code}: {exc.message}")
        except (RedisError, OSError) as exc:
            # This session's check only: the keeper goes on renewing the others' leases.
            self._fail(f"dependency_unavailable: Redis: {exc}")

    def fail_unless_ending(self, reason: str) -> None:
        """A failure the keeper found, unless the session began to end meanwhile (its leases
        are then released, not lost)."""
        if not self.ending:
            self._fail(reason)

    def _idle_for(self) -> float:
        """Seconds the session has waited for the client's bytes while the client could have
        sent something: it held credits and no write of its waited for Kafka (0 otherwise).
        Time the server spends on the client's frames, or holding it back, never counts."""
        if (
            not self.reading
            or self.available <= 0
            or any(stream.written for stream in self.streams.values())
        ):
            self.heard_at = self.clock()
            return 0.0
        return self.clock() - self.heard_at

    async def _record_points(self, streams: list[_Stream] | None = None) -> None:
        """Raises the stream points in Redis (state/stream_sessions.py) where they moved."""
        chosen = self.streams.values() if streams is None else streams
        await record_points(chosen, self.server.sessions_store)

    async def _release(self, stream: _Stream) -> None:
        try:
            await self.server.sessions_store.release(stream.key, self.token)
        except (RedisError, OSError) as exc:
            log.warning(
                "could not release stream %s (held until its lease ends): %s",
                "/".join(stream.key),
                exc,
            )
        finally:
            if self.server.holders.get(stream.key) is stream:
                del self.server.holders[stream.key]
            stream.released.set()


class StreamServer:
    """The listener and its sessions (see the module doc)."""

    def __init__(self, services: Services, config: StreamConfig) -> None:
        self.services = services
        self.config = config
        self.sessions_store = services.redis.stream_sessions(config.lease_ms)
        self.limits = connection_limits(services.settings, config.max_sessions)
        self.admission: Admission[Greeting] = Admission(self.limits)
        self.refusals = RefusalLog()
        self.connections: dict[Greeting, asyncio.Task[None]] = {}  # sessions or not yet
        self.sessions: set[Session] = set()
        # The streams this replica's sessions hold, by name: a NOTIFY of one of them waits for
        # its release (see Session._open).
        self.holders: dict[StreamKey, _Stream] = {}
        self.buffered = 0
        self.room = asyncio.Event()
        self.room.set()
        self._listeners: list[socket.socket] = []
        self._accepting: list[asyncio.Task[None]] = []
        self._keeper: asyncio.Task[None] | None = None
        self.replica = ""
        # Sessions whose ACK waits for the next ACK round: one timer for all of them, so that
        # held-back ACKs cost one loop wake-up per round, not one per session.
        self._answering: dict[Session, None] = {}
        self._answer_timer: asyncio.TimerHandle | None = None

    @property
    def waiting_bytes(self) -> int:
        """Bytes held of HELLO frames not yet whole: at most HELLO_MAX_BYTES and its length
        for each of at most ``max_pending`` connections."""
        return sum(len(greeting.received) for greeting in self.admission.reading())

    @property
    def port(self) -> int:
        """The port listened on (the one asked for, or the one the system chose for 0)."""
        port: int = self._listeners[0].getsockname()[1]
        return port

    async def start(self) -> None:
        self._listeners = await _listen(self.config.host, self.config.port)
        # This replica's id: its leases from a run before this one are free (no write of that
        # run can be in flight any more).
        self.replica = f"{socket.gethostname()}:{self.port}"
        try:
            freed = await self.sessions_store.release_replica(self.replica)
        except (RedisError, OSError) as exc:
            log.warning("could not free the stream leases of this replica's last run: %s", exc)
        else:
            if freed:
                log.info("freed %d stream leases this replica's last run held", freed)
        self._accepting = [
            asyncio.create_task(self._accept_forever(listener)) for listener in self._listeners
        ]
        self._keeper = asyncio.create_task(self._keep_forever())
        self.services.metrics.stream_sessions.set_function(lambda: len(self.sessions))
        self.services.metrics.stream_buffered_bytes.set_function(lambda: self.buffered)
        log.info("streaming produce listens on %s:%d", self.config.host, self.port)

    async def stop(self, grace_s: float = 10.0) -> None:
        """Stops listening; each session hears its last ACK and RESTART, then closes."""
        if not self._listeners:
            return
        for task in self._accepting:
            task.cancel()
        await asyncio.gather(*self._accepting, return_exceptions=True)
        for listener in self._listeners:
            listener.close()
        for greeting in list(self.connections):
            if greeting.session is not None:
                greeting.session.stop()
            else:
                greeting.stop("restart", frames.Restart())
        if self.connections:
            await asyncio.wait(list(self.connections.values()), timeout=grace_s)
        if self._keeper is not None:
            self._keeper.cancel()
            await asyncio.gather(self._keeper, return_exceptions=True)

    async def _keep_forever(self) -> None:
        """Every second, for every open session at once: ends the idle ones, checks the keys
        again, renews every lease in one Redis round trip and records the points that moved
        (one round trip per topic). One keeper per replica, not one per session: 1,000
        sessions cost a few Redis calls a second, not 2,000 (docs/streaming.md, "Many
        sessions")."""
        idle_s = self.limits.idle_timeout_s
        every = min(_KEEP_EVERY_S, self.sessions_store.lease_ms / 3000, idle_s / 4)
        while True:
            await asyncio.sleep(every)
            try:
                await self._keep_round(idle_s)
            except Exception:
                log.exception("streaming: renewing the sessions' leases failed")

    async def _keep_round(self, idle_s: float) -> None:
        live = [session for session in list(self.sessions) if session.kept(idle_s)]
        for session in live:
            await session.check_key()
        live = [session for session in live if session.error is None]
        held_by = [
            (session, stream) for session in live for stream in list(session.streams.values())
        ]
        try:
            held = await self.sessions_store.renew_each(
                [(stream.key, session.token) for session, stream in held_by]
            )
        except (RedisError, OSError) as exc:
            for session in dict.fromkeys(session for session, _ in held_by):
                session.fail_unless_ending(f"dependency_unavailable: Redis: {exc}")
            return
        for (session, stream), h in zip(held_by, held, strict=True):
            # (a stream that EOS closed meanwhile was released, not lost)
            if not (h or stream.closing or session.error is not None):
                session.fail_unless_ending(
                    f"dependency_unavailable: the lease of stream {stream.stream_id} was lost"
                )
        await record_points(
            [
                stream
                for session in live
                if session.error is None and not session.ending
                for stream in session.streams.values()
            ],
            self.sessions_store,
        )

    async def _accept_forever(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                sock, _ = await loop.sock_accept(listener)
            except OSError as exc:
                # Out of file descriptors or memory: asyncio's own servers wait a second too.
                log.error("streaming listener could not accept a connection: %s", exc)
                await asyncio.sleep(1.0)
                continue
            keep_alive(sock, self.limits.idle_timeout_s)
            greeting = Greeting(sock)
            greeting.task = asyncio.create_task(self._serve(greeting))
            self.connections[greeting] = greeting.task
            # An accept that needs no wait does not yield: a flood of connections must not
            # starve the sessions (nor the connections it just accepted).
            await asyncio.sleep(0)

    async def _serve(self, greeting: Greeting) -> None:
        try:
            session = await self._welcome(greeting)
            if session is not None:
                self.sessions.add(session)
                try:
                    await session.run()
                finally:
                    self.sessions.discard(session)
        finally:
            self.connections.pop(greeting, None)
            self.admission.leave(greeting)

    async def _welcome(self, greeting: Greeting) -> Session | None:
        """The connection's HELLO and key, then its session on its own protocol; None when it
        was refused or closed first (counted here)."""
        how = "closed"
        try:
            turned_away = self.admission.arrive(greeting)
            if turned_away is greeting:
                raise Refused("dependency_unavailable", _TOO_MANY_WAITING)
            if turned_away is not None:
                self.refusals.note(turned_away.peer, f"dependency_unavailable: {_TOO_MANY_WAITING}")
                turned_away.stop("refused", frames.Error(_TOO_MANY_WAITING_ERROR))
            try:
                hello = await asyncio.wait_for(
                    greeting.hello(self.admission), self.limits.hello_timeout_s
                )
            except TimeoutError:
                raise Refused(PROTOCOL_ERROR, "no HELLO in time") from None
            who = await self._check_key(hello)
            refused = self.admission.open(greeting, who.key_id)
            if refused is not None:
                raise refused
            loop = asyncio.get_running_loop()
            _, connection = await loop.connect_accepted_socket(_Connection, sock=greeting.sock)
        except (Refused, frames.FrameError) as exc:
            how = "refused"
            reason = str(exc) if isinstance(exc, Refused) else f"{PROTOCOL_ERROR}: {exc}"
            self.refusals.note(greeting.peer, reason)
            greeting.send(frames.Error(reason.encode()[: frames.U16_MAX]))
        except OSError:  # the client went away
            how = "closed"
        except asyncio.CancelledError:
            if greeting.stopped_as is None:
                greeting.sock.close()
                raise
            how = greeting.stopped_as
        except Exception:
            log.exception("streaming connection %s failed before its session", greeting.peer)
            how = "error"
            greeting.send(frames.Error(b"internal: the server failed; reconnect"))
        else:
            greeting.session = Session(self, connection, greeting, hello, who)
            return greeting.session
        greeting.sock.close()
        self.services.metrics.stream_session_ends.labels(how).inc()
        return None

    async def _check_key(self, hello: frames.Hello) -> Principal:
        """HELLO's cookie as an API key whose role may produce; Refused otherwise. Its
        project and topics are checked at each NOTIFY (a key may be for some topics only)."""
        try:
            cookie = hello.cookie.decode()
        except UnicodeDecodeError:
            raise Refused("unauthorized", "the cookie is not an API key") from None
        try:
            who = await self.services.auth.principal(f"Bearer {cookie}")
            check_role(who, Permission.PRODUCE)
        except SetuError as exc:
            raise refusal(exc) from None
        return who

    def answer_soon(self, session: Session) -> None:
        """``session`` sends its ACK at the next ACK round, at most the ACK delay from now."""
        self._answering[session] = None
        if self._answer_timer is None:
            loop = asyncio.get_running_loop()
            self._answer_timer = loop.call_later(self.config.ack_delay_s, self._answer_round)

    def _answer_round(self) -> None:
        self._answer_timer = None
        answering, self._answering = self._answering, {}
        for session in answering:
            session.answer()

    def add_buffered(self, size: int) -> None:
        self.buffered += size
        if self.buffered >= self.config.buffer_bytes:
            self.room.clear()
        elif not self.room.is_set():
            self.room.set()

    def forget_buffered(self, stream: _Stream) -> None:
        """A session gave up on writes Kafka never reported: their bytes no longer count."""
        self.add_buffered(-sum(size for size, _ in stream.written.values()))
        stream.written.clear()


async def record_points(streams: Iterable[_Stream], store: StreamSessions) -> None:
    """Raises the points of ``streams`` in Redis where they moved (state/stream_sessions.py):
    one round trip per topic. The points only save a resend (ingest's producer marks still say
    where to resume), so a failure is logged."""
    by_topic: dict[tuple[str, str], dict[str, tuple[int, int]]] = {}
    # Each point as it is now: Kafka's reports go on moving it while Redis answers, and a
    # stream counted as recorded past what was sent would never record the rest (its next
    # session would resume lower, and the producer's resends be written twice).
    moved = [(s, s.tracker.point) for s in streams if s.tracker.point > s.recorded]
    for stream, point in moved:
        marks = by_topic.setdefault((stream.project, stream.topic), {})
        marks[stream.producer] = (stream.incarnation, point - 1)
    try:
        for (project, topic), marks in by_topic.items():
            await store.record(project, topic, marks)
    except (RedisError, OSError) as exc:
        log.warning("streaming: could not record stream points: %s", exc)
        return
    for stream, point in moved:
        stream.recorded = max(stream.recorded, point)


async def _listen(host: str, port: int) -> list[socket.socket]:
    """Listening sockets for every address ``host`` names ("" or "0.0.0.0": every interface of
    its family), as asyncio's servers bind them; the listener accepts on them itself, so that
    nothing is read from a connection before it is known."""
    loop = asyncio.get_running_loop()
    found = await loop.getaddrinfo(
        host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )
    listeners: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(found):
            listener = socket.socket(family, kind, proto)
            listeners.append(listener)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                listener.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            listener.bind(address)
            listener.listen(_BACKLOG)
            listener.setblocking(False)
    except OSError:
        for listener in listeners:
            listener.close()
        raise
    return listeners
