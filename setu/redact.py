"""Connection URLs as they may be shown: with any password replaced (docs/security.md §8).

Redis and database URLs carry their password in the user-info part
(``rediss://:secret@host:6380/0``, ``postgresql+psycopg://setu:secret@db/setu``) or, for
libpq, possibly as a ``password=`` query parameter; anything that prints or logs such a URL
shows :func:`url_without_password` of it instead.
"""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

MASK = "***"


def url_without_password(url: str) -> str:
    """``url`` with every password in it (user-info, ``password``-like query parameters)
    replaced by ``***``; the rest as it was."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return MASK
    userinfo, at, hostport = parts.netloc.rpartition("@")
    netloc = parts.netloc
    if at and ":" in userinfo:
        netloc = f"{userinfo.partition(':')[0]}:{MASK}@{hostport}"
    query = "&".join(
        f"{pair.partition('=')[0]}={MASK}" if "password" in pair.partition("=")[0].lower() else pair
        for pair in parts.query.split("&")
    )
    if (netloc, query) == (parts.netloc, parts.query):
        return url
    return urlunsplit(parts._replace(netloc=netloc, query=query))
