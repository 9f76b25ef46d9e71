"""How ``setu api`` serves HTTP: uvicorn with httptools, and a limit on the request head.

httptools buffers a request line and its headers for as long as they keep coming, with no
limit of its own: a client could send megabytes of headers and hold the memory. The protocol
here counts the bytes that arrive while a request's head is incomplete and, past
:data:`~setu.limits.MAX_REQUEST_HEAD_BYTES`, answers 431 in the API's error shape and closes
the connection (docs/limits.md).
"""

from __future__ import annotations

from typing import Any

import orjson
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from setu.limits import MAX_REQUEST_HEAD_BYTES


def _answer_431(limit: int) -> bytes:
    body = orjson.dumps(
        {
            "error": {
                "code": "request_header_fields_too_large",
                "message": f"the request line and headers exceed {limit} bytes",
            }
        }
    )
    return (
        b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
        b"content-type: application/json\r\n"
        b"content-length: %d\r\n"
        b"connection: close\r\n\r\n%s" % (len(body), body)
    )


class LimitedHeadProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, refusing a request head over ``head_limit`` bytes."""

    head_limit = MAX_REQUEST_HEAD_BYTES

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_head = True
        self._head_bytes = 0

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head = True
        self._head_bytes = 0

    def on_headers_complete(self) -> None:
        self._in_head = False
        super().on_headers_complete()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if not self._in_head or self.transport.is_closing():
            return
        # Still inside a head after this chunk: all of it (at most one chunk more than the
        # head itself) counts toward the limit.
        self._head_bytes += len(data)
        if self._head_bytes > self.head_limit:
            self.logger.warning("request head over %d bytes: answered 431", self.head_limit)
            self.transport.write(_answer_431(self.head_limit))
            self.transport.close()


def uvicorn_options() -> dict[str, Any]:
    """The options every ``uvicorn.run`` of the API uses (``setu api`` and the benchmarks)."""
    return {"http": LimitedHeadProtocol}
