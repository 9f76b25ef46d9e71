"""How ``setu api`` serves HTTP: uvicorn with httptools, and limits on each request head.

httptools buffers a request line and its headers for as long as they keep coming, with no
limit of its own in size or in time: a client could send megabytes of headers and hold the
memory, or hold a connection open with a head that never ends. The protocol here:

- refuses a head over :data:`~setu.limits.MAX_REQUEST_HEAD_BYTES` with 431 in the API's error
  shape and closes the connection. Two counts, so that it holds however the head arrives:
  the bytes received while a head is still incomplete (a head that keeps coming, or one
  long header httptools is still buffering), and the request line and headers httptools
  hands over (a head that arrives complete in one read, which it parses before any check
  after the read could run);
- closes a connection whose request head is not complete ``head_timeout_s`` after it opened
  or after the head's first byte (``SETU_HTTP_HEAD_TIMEOUT_MS``), answering 408 when part of
  a head had come. A connection idle between requests is uvicorn's keep-alive timeout's.

docs/limits.md lists the limits, docs/security.md §9 what they protect.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any

import orjson
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from setu.limits import DEFAULT_HTTP_HEAD_TIMEOUT_MS, MAX_REQUEST_HEAD_BYTES

# Counted per header besides its name and value: ": " and the line's CRLF.
_HEADER_FRAMING = 4


def _answer(status: bytes, code: str, message: str) -> bytes:
    """A whole HTTP answer in the API's error shape that closes the connection."""
    body = orjson.dumps({"error": {"code": code, "message": message}})
    return (
        b"HTTP/1.1 %s\r\n"
        b"content-type: application/json\r\n"
        b"content-length: %d\r\n"
        b"connection: close\r\n\r\n%s" % (status, len(body), body)
    )


def _answer_431(limit: int) -> bytes:
    return _answer(
        b"431 Request Header Fields Too Large",
        "request_header_fields_too_large",
        f"the request line and headers exceed {limit} bytes",
    )


def _answer_408(timeout_s: float) -> bytes:
    return _answer(
        b"408 Request Timeout",
        "request_timeout",
        f"the request line and headers did not arrive within {timeout_s:g} s",
    )


class LimitedHeadProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, refusing a request head over ``head_limit`` bytes or
    slower than ``head_timeout_s`` (see the module doc)."""

    head_limit = MAX_REQUEST_HEAD_BYTES

    def __init__(
        self,
        *args: Any,
        head_timeout_s: float = DEFAULT_HTTP_HEAD_TIMEOUT_MS / 1000,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.head_timeout_s = head_timeout_s
        # From a request's first byte to the end of its headers.
        self._in_head = True
        # Bytes received while a head was incomplete (at most one read more than the head).
        self._head_bytes = 0
        # The request line and headers parsed so far.
        self._parsed_head_bytes = 0
        # No head has begun since the last request ended: the next bytes start one.
        self._awaiting_head = True
        # A request ended in the read being parsed.
        self._message_ended = False
        self._head_timer: asyncio.TimerHandle | None = None
        # Answered 431 or 408: whatever is still parsed is ignored.
        self._refused = False

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._start_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_head_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        self._message_ended = False
        super().data_received(data)
        if self._refused or self.transport.is_closing():
            return
        # A head still to come in full after this read (one begun, or bytes between requests
        # that began none) is timed; a request that came whole in one read costs no timer.
        waiting = self._in_head or (self._awaiting_head and not self._message_ended)
        if waiting and self._head_timer is None:
            self._start_head_timer()
        if not self._in_head:
            return
        self._head_bytes += len(data)
        if self._head_bytes > self.head_limit:
            self._refuse_large_head()

    # httptools callbacks

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head = True
        self._awaiting_head = False
        self._head_bytes = 0
        self._parsed_head_bytes = 0

    def on_url(self, url: bytes) -> None:
        super().on_url(url)
        self._parsed_head_bytes += len(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        super().on_header(name, value)
        self._parsed_head_bytes += len(name) + len(value) + _HEADER_FRAMING

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._stop_head_timer()
        if self._refused:
            return
        if self._parsed_head_bytes > self.head_limit:
            self._refuse_large_head()
            return
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if not self._refused:
            super().on_body(body)

    def on_message_complete(self) -> None:
        self._awaiting_head = True
        self._message_ended = True
        if not self._refused:
            super().on_message_complete()

    # The head's time

    def _start_head_timer(self) -> None:
        self._head_timer = self.loop.call_later(self.head_timeout_s, self._head_timed_out)

    def _stop_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_complete:
            # Still answering the request before: the next head's time starts again.
            self._start_head_timer()
            return
        self.logger.debug("request head not complete within %g s: closed", self.head_timeout_s)
        began = self._in_head and not self._awaiting_head
        self._refuse(_answer_408(self.head_timeout_s) if began else b"")

    def _refuse_large_head(self) -> None:
        self.logger.warning("request head over %d bytes: answered 431", self.head_limit)
        self._refuse(_answer_431(self.head_limit))

    def _refuse(self, answer: bytes) -> None:
        """Writes ``answer`` (if any), closes the connection and ignores what follows."""
        self._refused = True
        self._stop_head_timer()
        if answer:
            self.transport.write(answer)
        self.transport.close()


def uvicorn_options(head_timeout_ms: int = DEFAULT_HTTP_HEAD_TIMEOUT_MS) -> dict[str, Any]:
    """The options every ``uvicorn.run`` of the API uses (``setu api``, the tests and the
    benchmarks); ``head_timeout_ms`` is ``SETU_HTTP_HEAD_TIMEOUT_MS``."""
    return {"http": functools.partial(LimitedHeadProtocol, head_timeout_s=head_timeout_ms / 1000)}
