"""Security headers on every HTTP answer of the API (docs/security.md §2).

- ``X-Content-Type-Options: nosniff``: a browser takes each answer for what its
  ``Content-Type`` says (a JSON error echoing a caller's text is never run as a page).
- ``Referrer-Policy: no-referrer``: the console's and ``/docs``' addresses go nowhere.
- ``X-Frame-Options: DENY`` and CSP ``frame-ancestors 'none'``: no page may frame the console
  (clickjacking an operator into an unsideline or a stop).
- ``Content-Security-Policy``: pages (``/console``, ``/docs``) load scripts, styles, images and
  API calls from the API itself only, and run no inline script; every other answer (JSON,
  static files) may load nothing at all.

A route that sets one of these headers itself keeps its own value.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

# The console and /docs: their own files only (data: for Swagger UI's SVG icons). Both pass
# in Chromium with no violation reported (tests/integration/on_dev_up/test_console.py).
PAGE_POLICY = (
    b"default-src 'none'; script-src 'self'; style-src 'self'; "
    b"img-src 'self' data:; connect-src 'self'; font-src 'self'; base-uri 'none'; "
    b"form-action 'none'; frame-ancestors 'none'"
)
# Everything else: an answer that is not a page loads nothing.
DATA_POLICY = b"default-src 'none'; frame-ancestors 'none'"

_COMMON = (
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
)


class SecurityHeaders:
    """Adds the headers above to every HTTP answer (a plain ASGI middleware: no body is
    touched, nothing is buffered)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = with_security_headers(list(message.get("headers", ())))
            await send(message)

        await self.app(scope, receive, send_with_headers)


def with_security_headers(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """``headers`` of an answer with the security headers it lacks added (pure)."""
    present = {name.lower() for name, _ in headers}
    out = list(headers)
    for name, value in _COMMON:
        if name not in present:
            out.append((name, value))
    if b"content-security-policy" not in present:
        content_type = next((v for n, v in headers if n.lower() == b"content-type"), b"")
        page = content_type.lower().startswith(b"text/html")
        out.append((b"content-security-policy", PAGE_POLICY if page else DATA_POLICY))
    return out
