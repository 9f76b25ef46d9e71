"""The frames of the streaming produce protocol (docs/design.md §11), byte for byte.

Every frame on the wire is a ``u32`` big-endian length of what follows, a ``u8`` type, then the
type's fields; ``short_bytes`` is a ``u16`` length and that many bytes; every integer is
big-endian. :func:`encode` makes a frame's bytes (length included); :class:`FrameReader` cuts a
byte stream into frames and :func:`decode` reads one frame's body (type and fields). Only the
standard library is used, so the client (``setu.client``) imports this module as the server
does.

A frame whose length is over the reader's ``max_frame_bytes`` is refused before its body is
read (the seed's note B1: nobody may make the other side hold a 4 GiB frame).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass

HELLO, OK, ERROR, NOTIFY, NOTIFY_ACK, MESSAGE, ACK, RESTART, EOS_MESSAGE = range(9)

# MESSAGE flags
EPHEMERAL = 1  # no message id
BOUNDARY = 2  # no payload
EOS = 4
UNSTABLE_REFERENCE = 8
EVENT_TIME = 16  # an event time follows the message id
KEY = 32  # a key follows
HEADERS = 64  # a header block follows the key (Setu's extension, docs/streaming.md)

DEFAULT_MAX_FRAME_BYTES = 4 * 1024 * 1024
# What setu.client sends as HELLO's version: the seed's protocol version. The server records
# the version a client sends and does not match it (docs/streaming.md, "Handshake").
PROTOCOL_VERSION = b"3"
U16_MAX, U32_MAX, U64_MAX = 2**16 - 1, 2**32 - 1, 2**64 - 1

_U8 = struct.Struct(">B")
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_I64 = struct.Struct(">q")


class FrameError(ValueError):
    """Bytes that are not a valid frame: the connection ends with ERROR."""


@dataclass(frozen=True, slots=True)
class Hello:
    version: bytes
    cookie: bytes
    program: bytes
    instance: bytes


@dataclass(frozen=True, slots=True)
class StreamReference:
    """One stream of an OK frame: its id, name and point of reference."""

    stream_id: int
    name: bytes
    point_of_reference: int


@dataclass(frozen=True, slots=True)
class Ok:
    initial_credits: int
    streams: tuple[StreamReference, ...] = ()
    pairs: tuple[tuple[bytes, bytes], ...] = ()


@dataclass(frozen=True, slots=True)
class Error:
    reason: bytes


@dataclass(frozen=True, slots=True)
class Notify:
    stream_id: int
    name: bytes
    point_of_reference: int


@dataclass(frozen=True, slots=True)
class NotifyAck:
    success: bool
    stream_id: int
    point_of_reference: int


@dataclass(frozen=True, slots=True)
class Message:
    stream_id: int
    flags: int
    message_id: int | None = None  # absent with EPHEMERAL
    event_time: int | None = None  # present with EVENT_TIME
    key: bytes | None = None  # present with KEY
    payload: bytes | None = None  # absent with BOUNDARY
    headers: tuple[tuple[bytes, bytes], ...] | None = None  # present with HEADERS


@dataclass(frozen=True, slots=True)
class Ack:
    credits: int
    acks: tuple[tuple[int, int], ...] = ()  # (stream id, point of reference)


@dataclass(frozen=True, slots=True)
class Restart:
    address: bytes = b""


@dataclass(frozen=True, slots=True)
class EosMessage:
    stream_id: int
    message_id: int


Frame = Hello | Ok | Error | Notify | NotifyAck | Message | Ack | Restart | EosMessage


def _short(data: bytes) -> bytes:
    if len(data) > U16_MAX:
        raise FrameError(f"a short_bytes field holds at most {U16_MAX} bytes, not {len(data)}")
    return _U16.pack(len(data)) + data


def _u(fmt: struct.Struct, value: int, what: str) -> bytes:
    try:
        return fmt.pack(value)
    except struct.error:
        raise FrameError(f"{what} {value} is out of range") from None


def _body(frame: Frame) -> bytes:
    match frame:
        case Hello():
            fields = (frame.version, frame.cookie, frame.program, frame.instance)
            return _U8.pack(HELLO) + b"".join(_short(f) for f in fields)
        case Ok():
            out = [_U8.pack(OK), _u(_U32, frame.initial_credits, "credits")]
            out.append(_U32.pack(len(frame.streams)))
            for stream in frame.streams:
                out += [_u(_U64, stream.stream_id, "stream id"), _short(stream.name)]
                out.append(_u(_U64, stream.point_of_reference, "point of reference"))
            out.append(_U32.pack(len(frame.pairs)))
            out += [_short(name) + _short(value) for name, value in frame.pairs]
            return b"".join(out)
        case Error():
            return _U8.pack(ERROR) + _short(frame.reason)
        case Notify():
            return (
                _U8.pack(NOTIFY)
                + _u(_U64, frame.stream_id, "stream id")
                + _short(frame.name)
                + _u(_U64, frame.point_of_reference, "point of reference")
            )
        case NotifyAck():
            return (
                _U8.pack(NOTIFY_ACK)
                + _U8.pack(1 if frame.success else 0)
                + _u(_U64, frame.stream_id, "stream id")
                + _u(_U64, frame.point_of_reference, "point of reference")
            )
        case Message():
            return _message_body(frame)
        case Ack():
            out = [_U8.pack(ACK), _u(_U32, frame.credits, "credits"), _U32.pack(len(frame.acks))]
            for stream_id, point in frame.acks:
                out += [_u(_U64, stream_id, "stream id"), _u(_U64, point, "point of reference")]
            return b"".join(out)
        case Restart():
            return _U8.pack(RESTART) + _U32.pack(len(frame.address)) + frame.address
        case EosMessage():
            return (
                _U8.pack(EOS_MESSAGE)
                + _u(_U64, frame.stream_id, "stream id")
                + _u(_U64, frame.message_id, "message id")
            )
    raise TypeError(f"not a frame: {frame!r}")


def _message_body(frame: Message) -> bytes:
    flags = frame.flags
    if not 0 <= flags <= 255:
        raise FrameError(f"flags {flags} are out of range")
    out = [_U8.pack(MESSAGE), _u(_U64, frame.stream_id, "stream id"), _U8.pack(flags)]
    if not flags & EPHEMERAL:
        if frame.message_id is None:
            raise FrameError("a MESSAGE without the EPHEMERAL flag needs a message id")
        out.append(_u(_U64, frame.message_id, "message id"))
    if flags & EVENT_TIME:
        if frame.event_time is None:
            raise FrameError("a MESSAGE with the EVENT_TIME flag needs an event time")
        out.append(_u(_I64, frame.event_time, "event time"))
    if flags & KEY:
        if frame.key is None:
            raise FrameError("a MESSAGE with the KEY flag needs a key")
        out.append(_short(frame.key))
    if flags & HEADERS:
        if frame.headers is None:
            raise FrameError("a MESSAGE with the HEADERS flag needs a header block")
        out.append(header_block(frame.headers))
    if not flags & BOUNDARY:
        out.append(frame.payload or b"")
    return b"".join(out)


def header_block(headers: tuple[tuple[bytes, bytes], ...]) -> bytes:
    """A MESSAGE's header block: ``u16`` count, then each (short_bytes name, short_bytes
    value)."""
    if len(headers) > U16_MAX:
        raise FrameError(f"a header block holds at most {U16_MAX} headers")
    return _U16.pack(len(headers)) + b"".join(
        _short(name) + _short(value) for name, value in headers
    )


_MESSAGE_HEAD = struct.Struct(">IBQBQ")  # length, type, stream id, flags, message id


def message_frame(
    stream_id: int,
    message_id: int,
    key: bytes | None,
    payload: bytes,
    headers: tuple[tuple[bytes, bytes], ...] | None = None,
) -> bytes:
    """``encode(Message(stream_id, flags, message_id, None, key, payload, headers))`` with
    KEY and HEADERS set as given, without building the frame object: the producer's hot
    path."""
    if key is None:
        flags, tail = 0, payload
    else:
        flags, tail = KEY, _short(key) + payload
    if headers is not None:
        flags |= HEADERS
        if key is None:
            tail = header_block(headers) + payload
        else:
            tail = _short(key) + header_block(headers) + payload
    try:
        head = _MESSAGE_HEAD.pack(18 + len(tail), MESSAGE, stream_id, flags, message_id)
    except struct.error:
        raise FrameError("a stream id or message id is out of range") from None
    return head + tail


def encode(frame: Frame) -> bytes:
    """The frame's bytes on the wire, its length first."""
    body = _body(frame)
    return _U32.pack(len(body)) + body


class _Cursor:
    """Reads the fields of one frame's body; running past its end is a FrameError."""

    def __init__(self, body: bytes) -> None:
        self.body = memoryview(body)
        self.at = 1  # after the type byte

    def take(self, fmt: struct.Struct) -> int:
        end = self.at + fmt.size
        if end > len(self.body):
            raise FrameError("frame ends inside a field")
        (value,) = fmt.unpack_from(self.body, self.at)
        self.at = end
        return int(value)

    def raw(self, n: int) -> bytes:
        end = self.at + n
        if end > len(self.body):
            raise FrameError("frame ends inside a field")
        out = bytes(self.body[self.at : end])
        self.at = end
        return out

    def short(self) -> bytes:
        return self.raw(self.take(_U16))

    def done(self, frame: Frame) -> Frame:
        if self.at != len(self.body):
            raise FrameError(f"{len(self.body) - self.at} bytes left over after the frame")
        return frame


def decode(body: bytes) -> Frame:
    """One frame from its body (the bytes after the length); raises FrameError."""
    if not body:
        raise FrameError("empty frame")
    kind, c = body[0], _Cursor(body)
    if kind == HELLO:
        return c.done(Hello(c.short(), c.short(), c.short(), c.short()))
    if kind == OK:
        credits = c.take(_U32)
        streams = tuple(
            StreamReference(c.take(_U64), c.short(), c.take(_U64)) for _ in range(c.take(_U32))
        )
        pairs = tuple((c.short(), c.short()) for _ in range(c.take(_U32)))
        return c.done(Ok(credits, streams, pairs))
    if kind == ERROR:
        return c.done(Error(c.short()))
    if kind == NOTIFY:
        return c.done(Notify(c.take(_U64), c.short(), c.take(_U64)))
    if kind == NOTIFY_ACK:
        success = c.take(_U8)
        if success > 1:
            raise FrameError(f"NOTIFY_ACK success must be 0 or 1, not {success}")
        return c.done(NotifyAck(success == 1, c.take(_U64), c.take(_U64)))
    if kind == MESSAGE:
        return _message(body, 1, len(body))
    if kind == ACK:
        credits = c.take(_U32)
        acks = tuple((c.take(_U64), c.take(_U64)) for _ in range(c.take(_U32)))
        return c.done(Ack(credits, acks))
    if kind == RESTART:
        return c.done(Restart(c.raw(c.take(_U32))))
    if kind == EOS_MESSAGE:
        return c.done(EosMessage(c.take(_U64), c.take(_U64)))
    raise FrameError(f"unknown frame type {kind}")


_MESSAGE_FIELDS = struct.Struct(">QB")  # stream id, flags
_INSIDE = "frame ends inside a field"


def _message(data: bytes | bytearray, at: int, end: int) -> Message:
    """The MESSAGE whose fields are ``data[at:end]`` (after the type byte), read in place: the
    server's hot path, many to a read."""
    if end - at < 9:
        raise FrameError(_INSIDE)
    stream_id, flags = _MESSAGE_FIELDS.unpack_from(data, at)
    at += 9
    message_id = event_time = key = payload = None
    headers: tuple[tuple[bytes, bytes], ...] | None = None
    if not flags & EPHEMERAL:
        if end - at < 8:
            raise FrameError(_INSIDE)
        (message_id,) = _U64.unpack_from(data, at)
        at += 8
    if flags & EVENT_TIME:
        if end - at < 8:
            raise FrameError(_INSIDE)
        (event_time,) = _I64.unpack_from(data, at)
        at += 8
    if flags & KEY:
        if end - at < 2:
            raise FrameError(_INSIDE)
        (size,) = _U16.unpack_from(data, at)
        at += 2
        if end - at < size:
            raise FrameError(_INSIDE)
        key = bytes(data[at : at + size])
        at += size
    if flags & HEADERS:
        headers, at = _header_block(data, at, end)
    if not flags & BOUNDARY:
        payload = bytes(data[at:end])
    elif at != end:
        raise FrameError(f"{end - at} bytes left over after the frame")
    return Message(stream_id, flags, message_id, event_time, key, payload, headers)


def _header_block(
    data: bytes | bytearray, at: int, end: int
) -> tuple[tuple[tuple[bytes, bytes], ...], int]:
    """The header block at ``data[at:]`` and where it ends."""
    if end - at < 2:
        raise FrameError(_INSIDE)
    (count,) = _U16.unpack_from(data, at)
    at += 2
    out = []
    for _ in range(count):
        pair = []
        for _field in range(2):
            if end - at < 2:
                raise FrameError(_INSIDE)
            (size,) = _U16.unpack_from(data, at)
            at += 2
            if end - at < size:
                raise FrameError(_INSIDE)
            pair.append(bytes(data[at : at + size]))
            at += size
        out.append((pair[0], pair[1]))
    return tuple(out), at


class FrameReader:
    """Cuts a byte stream into frame bodies; refuses a frame over ``max_frame_bytes``."""

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self.max_frame_bytes = max_frame_bytes
        self._buffer = bytearray()

    def feed(self, data: bytes) -> Iterator[Frame]:
        """The whole frames ``data`` completes, decoded; raises FrameError on a bad one."""
        self._buffer += data
        buffer, at = self._buffer, 0
        try:
            while len(buffer) - at >= 4:
                (length,) = _U32.unpack_from(buffer, at)
                if length > self.max_frame_bytes:
                    raise FrameError(
                        f"a frame of {length} bytes is over the limit of {self.max_frame_bytes}"
                    )
                if len(buffer) - at < 4 + length:
                    return
                start, at = at + 4, at + 4 + length
                if length and buffer[start] == MESSAGE:
                    yield _message(buffer, start + 1, at)
                else:
                    yield decode(bytes(buffer[start:at]))
        finally:
            # Cut once per feed, not once per frame: many small frames arrive in one read.
            del buffer[:at]

    @property
    def pending(self) -> int:
        """Bytes held of a frame not yet whole."""
        return len(self._buffer)
