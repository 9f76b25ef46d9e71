"""The outside security probe's findings, each with the shape of its reproducer. Every one has
at least one test marked ``@pytest.mark.finding("<id>")`` that runs that reproducer, scaled to
CI: ``scripts/test -m finding`` is the regression suite, and ``tests/unit/test_findings.py``
fails when a finding loses its last test."""

from __future__ import annotations

FINDINGS = {
    "H1": "no key: streaming connections send a frame's length and most of its body, never HELLO",
    "H2": "no key: large control-plane bodies, and a Content-Length of 1 GB, before any 401",
    "H3": "one producer key: a burst of compressible 1 MiB messages, too big for the job's heap",
    "M1": "no key: idle connections without HELLO take every streaming session slot",
    "M3": "owner key: a PUT moving only endpoint.url carries the stored header values along",
    "L2": "anonymous /metrics names every project and topic",
    "L3": "no security headers on pages and answers; /docs keeps the key in the browser",
    "L4": "partial request heads held open without end",
    "L5": "a viewer reads the start of every failed webhook answer",
    "L6": "one session opens unbounded streams; one key takes every session slot",
    "L7": "random well-formed key ids each cost a database query; refusals each log a WARNING",
    "L8": "a subscription's status read right after its create answers 503",
    "I1": "a request head over the limit that arrives in one read is served",
}
