"""Golden bytes of every frame type of the streaming protocol (docs/design.md §11), written out
by hand from the layout: length (u32), type (u8), fields, every integer big-endian."""

from __future__ import annotations

import pytest

from setu.stream import frames
from setu.stream.frames import (
    BOUNDARY,
    EPHEMERAL,
    EVENT_TIME,
    HEADERS,
    KEY,
    Ack,
    EosMessage,
    Error,
    FrameError,
    FrameReader,
    Hello,
    Message,
    Notify,
    NotifyAck,
    Ok,
    Restart,
    StreamReference,
    decode,
    encode,
)


def h(text: str) -> bytes:
    """Hex with spaces and | between fields, for readable vectors."""
    return bytes.fromhex(text.replace("|", " "))


GOLDEN = [
    (
        Hello(b"v1", b"key", b"p", b"i"),
        # len 16 | HELLO | "v1" | "key" | "p" | "i"
        h("00000010|00|0002 7631|0003 6b6579|0001 70|0001 69"),
    ),
    (
        Ok(100, (StreamReference(7, b"s", 5),), ((b"a", b"b"),)),
        # len 38 | OK | credits 100 | 1 stream: id 7, "s", 5 | 1 pair: "a", "b"
        h(
            "00000026|01|00000064|00000001|0000000000000007 0001 73 0000000000000005"
            "|00000001|0001 61 0001 62"
        ),
    ),
    (Error(b"no"), h("00000005|02|0002 6e6f")),
    (
        Notify(1, b"p/t/x", 0),
        # len 24 | NOTIFY | stream 1 | "p/t/x" | point 0
        h("00000018|03|0000000000000001|0005 702f742f78|0000000000000000"),
    ),
    (
        NotifyAck(True, 1, 42),
        h("00000012|04|01|0000000000000001|000000000000002a"),
    ),
    (NotifyAck(False, 2, 0), h("00000012|04|00|0000000000000002|0000000000000000")),
    (
        Message(1, KEY, message_id=9, key=b"g1", payload=b"hi"),
        # len 24 | MESSAGE | stream 1 | flags 32 | id 9 | key "g1" | payload "hi"
        h("00000018|05|0000000000000001|20|0000000000000009|0002 6731|6869"),
    ),
    (
        Message(1, EVENT_TIME | KEY, message_id=3, event_time=-1, key=b"", payload=b""),
        # flags 48: id, event time (signed), an empty key, an empty payload
        h("0000001c|05|0000000000000001|30|0000000000000003|ffffffffffffffff|0000"),
    ),
    (
        Message(
            1,
            KEY | HEADERS,
            message_id=9,
            key=b"g",
            payload=b"hi",
            headers=((b"X_REGION", b"eu"), (b"traceparent", b"")),
        ),
        # len 54 | MESSAGE | stream 1 | flags 96 | id 9 | key "g" | 2 headers: "X_REGION" "eu",
        # "traceparent" "" | payload "hi"
        h(
            "00000036|05|0000000000000001|60|0000000000000009|0001 67"
            "|0002|0008 585f524547494f4e 0002 6575|000b 7472616365706172656e74 0000|6869"
        ),
    ),
    (
        Message(4, EPHEMERAL | BOUNDARY),
        # flags 3: no message id, no payload
        h("0000000a|05|0000000000000004|03"),
    ),
    (
        Ack(10, ((1, 100), (2, 0))),
        h(
            "00000029|06|0000000a|00000002|0000000000000001 0000000000000064"
            "|0000000000000002 0000000000000000"
        ),
    ),
    (Restart(), h("00000005|07|00000000")),
    (Restart(b"h:1"), h("00000008|07|00000003 683a31")),
    (EosMessage(1, 77), h("00000011|08|0000000000000001|000000000000004d")),
]


@pytest.mark.parametrize(("frame", "wire"), GOLDEN, ids=lambda x: type(x).__name__)
def test_every_frame_type_has_the_bytes_of_the_layout(frame: object, wire: bytes) -> None:
    assert encode(frame) == wire  # type: ignore[arg-type]
    assert decode(wire[4:]) == frame


def test_a_stream_of_frames_is_cut_wherever_the_bytes_break() -> None:
    wire = b"".join(w for _, w in GOLDEN)
    reader = FrameReader()
    got = []
    for at in range(0, len(wire), 7):
        got += list(reader.feed(wire[at : at + 7]))
    assert got == [f for f, _ in GOLDEN] and reader.pending == 0


def test_a_frame_over_the_limit_is_refused_before_its_body_arrives() -> None:
    reader = FrameReader(max_frame_bytes=16)
    with pytest.raises(FrameError, match="over the limit of 16"):
        list(reader.feed(h("00000011|00")))


@pytest.mark.parametrize(
    ("body", "error"),
    [
        (b"", "empty frame"),
        (h("09"), "unknown frame type 9"),
        (h("02|0005 6e6f"), "ends inside a field"),
        (h("02|0002 6e6f|00"), "1 bytes left over"),
        (h("04|02|0000000000000001|0000000000000000"), "success must be 0 or 1"),
        (h("05|0000000000000001|20|0000000000000009|0005 67"), "ends inside a field"),
        (h("08|0000000000000001"), "ends inside a field"),
    ],
)
def test_broken_bytes_are_a_frame_error(body: bytes, error: str) -> None:
    with pytest.raises(FrameError, match=error):
        decode(body)
    # And the same from a byte stream (a MESSAGE is read in place there)
    with pytest.raises(FrameError, match=error):
        list(FrameReader().feed(len(body).to_bytes(4, "big") + body))


@pytest.mark.parametrize(
    "body",
    [
        h("05|0000000000000001"),  # no flags byte
        h("05|0000000000000001|00|00000000"),  # a short message id
        h("05|0000000000000001|10|0000000000000009|0000"),  # a short event time
        h("05|0000000000000001|20|0000000000000009|00"),  # a short key length
        h("05|0000000000000001|02|0000000000000009|ff"),  # a boundary with a payload
        h("05|0000000000000001|40|0000000000000009|00"),  # a short header count
        h("05|0000000000000001|40|0000000000000009|0001|0002 58"),  # a short header name
        h("05|0000000000000001|40|0000000000000009|0001|0001 58|0003 65"),  # a short value
    ],
)
def test_every_truncated_message_is_a_frame_error_from_a_stream(body: bytes) -> None:
    with pytest.raises(FrameError):
        list(FrameReader().feed(len(body).to_bytes(4, "big") + body))


def test_fields_that_do_not_fit_their_width_are_refused() -> None:
    with pytest.raises(FrameError, match="at most 65535 bytes"):
        encode(Error(b"x" * 65536))
    with pytest.raises(FrameError, match="out of range"):
        encode(Ack(2**32))
    with pytest.raises(FrameError, match="needs a message id"):
        encode(Message(1, 0, payload=b"x"))


@pytest.mark.parametrize(
    ("key", "payload"), [(b"order-7", b"body"), (None, b"body"), (b"", b""), (b"k" * 300, b"x")]
)
def test_the_fast_message_encoder_makes_the_same_bytes(key: bytes | None, payload: bytes) -> None:
    flags = frames.KEY if key is not None else 0
    expected = frames.encode(frames.Message(3, flags, 2**40 + 7, None, key, payload))
    assert frames.message_frame(3, 2**40 + 7, key, payload) == expected
    # and with a header block
    headers = ((b"X_REGION", b"eu"), (b"content-type", b"text/plain"))
    expected = frames.encode(
        frames.Message(3, flags | frames.HEADERS, 2**40 + 7, None, key, payload, headers)
    )
    assert frames.message_frame(3, 2**40 + 7, key, payload, headers) == expected


def test_the_fast_message_encoder_refuses_what_does_not_fit() -> None:
    with pytest.raises(frames.FrameError):
        frames.message_frame(1, 2**64, None, b"")
    with pytest.raises(frames.FrameError):
        frames.message_frame(1, 1, b"k" * 70_000, b"")
