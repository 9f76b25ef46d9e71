"""What the client raises: the server's error code and message, never the key."""

from __future__ import annotations


class SetuClientError(Exception):
    """A call Setu refused, or could not be made; ``code`` is the API's error code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class HttpError(SetuClientError):
    """An HTTP call that ended with a non-2xx status (after any retries)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(code, message)
        self.status = status


class StreamError(SetuClientError):
    """A streaming producer that cannot go on: the server's ERROR, or no reconnect in time."""
