"""Tracing with OpenTelemetry: one trace per message, from produce to each webhook call.

docs/latency.md ("Tracing") is the design. In short:

- **On or off.** A process traces when the SDK's standard variables ask for an exporter:
  ``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` set, and neither
  ``OTEL_SDK_DISABLED=true`` nor ``OTEL_TRACES_EXPORTER=none``. Spans then go out with OTLP over
  HTTP, batched (the SDK's ``BatchSpanProcessor``, with its own ``OTEL_BSP_*`` settings). Off,
  no span is made at all: the hot paths test one attribute and carry the producer's own trace
  context through unchanged.
- **The context travels with the message.** W3C ``traceparent`` (and ``tracestate``) are taken
  from the produce request, or started there, and ride in the Kafka headers of the same names
  (:class:`setu.envelope.Envelope`) through the ingest and main topics and every retry copy.
  Each webhook call sends its own span's context, so the endpoint's server spans join the
  producer's trace.
- **Spans.** ``produce`` (the API, kind PRODUCER, one per request), ``ingest batch`` (the
  ingest job, per batch, linked to the trace contexts of its first messages) and ``deliver``
  (the delivery worker, kind CLIENT, one per webhook call, a child of the message's context).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import SpanKind, Status, StatusCode, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
# W3C Trace Context, version 00: version-traceid-parentid-flags, ids not all zero.
_TRACEPARENT_RE = re.compile(r"00-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}")
MAX_TRACESTATE_CHARS = 512  # the W3C limit

_PROPAGATOR = TraceContextTextMapPropagator()


def valid_traceparent(value: str | None) -> str | None:
    """``value`` if it is a well-formed version-00 traceparent, else None (the W3C rule: a
    malformed one is ignored, never an error)."""
    if value is None:
        return None
    value = value.strip().lower()
    return value if _TRACEPARENT_RE.fullmatch(value) else None


def valid_tracestate(value: str | None) -> str | None:
    if value is None:
        return None
    value = value.strip()
    if not value or len(value) > MAX_TRACESTATE_CHARS or not value.isprintable():
        return None
    return value


def request_context(
    traceparent: str | None, tracestate: str | None
) -> tuple[str | None, str | None]:
    """A request's (traceparent, tracestate) as Setu keeps them: a malformed traceparent is
    dropped, and a tracestate only travels with a valid traceparent."""
    parent = valid_traceparent(traceparent)
    return parent, valid_tracestate(tracestate) if parent else None


def tracing_requested(env: Mapping[str, str]) -> bool:
    """Whether the SDK's standard variables ask for spans to be exported."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if env.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none":
        return False
    return bool(
        env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    )


class Tracing:
    """A process's tracer, or none (``enabled`` False: nothing is made)."""

    def __init__(self, tracer: Tracer | None, provider: Any = None) -> None:
        self.tracer = tracer
        self.enabled = tracer is not None
        self._provider = provider

    @classmethod
    def off(cls) -> Tracing:
        return cls(None)

    @classmethod
    def exporting(cls, service: str) -> Tracing:
        """OTLP over HTTP, configured by the SDK's own ``OTEL_*`` variables."""
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        # OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES win over the default name.
        provider = TracerProvider(resource=Resource.create({"service.name": service}))
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        return cls(provider.get_tracer("setu"), provider)

    @classmethod
    def with_provider(cls, provider: Any) -> Tracing:
        """A given SDK provider (tests use one with an in-memory exporter)."""
        return cls(provider.get_tracer("setu"), provider)

    def shutdown(self) -> None:
        """Sends what is still batched; called when the process stops."""
        if self._provider is not None:
            self._provider.shutdown()


_current = Tracing.off()


def configure(service: str, env: Mapping[str, str] | None = None) -> Tracing:
    """Sets up this process's tracing from the environment; returns it (also :func:`current`)."""
    global _current
    wanted = tracing_requested(os.environ if env is None else env)
    _current = Tracing.exporting(service) if wanted else Tracing.off()
    return _current


def use(tracing: Tracing) -> None:
    """Makes ``tracing`` this process's (tests)."""
    global _current
    _current = tracing


def current() -> Tracing:
    return _current


def context_of(traceparent: str | None, tracestate: str | None = None) -> Context | None:
    """The remote parent a message's headers name, or None."""
    if traceparent is None:
        return None
    carrier = {TRACEPARENT: traceparent}
    if tracestate:
        carrier[TRACESTATE] = tracestate
    return _PROPAGATOR.extract(carrier)


def headers_of(span: trace.Span) -> tuple[str, str | None]:
    """(traceparent, tracestate) naming ``span`` as the parent of what comes next."""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, trace.set_span_in_context(span))
    return carrier[TRACEPARENT], carrier.get(TRACESTATE)


@contextmanager
def span(
    tracing: Tracing,
    name: str,
    kind: SpanKind,
    parent: Context | None = None,
    attributes: Mapping[str, Any] | None = None,
    start_ns: int | None = None,
) -> Iterator[trace.Span]:
    """A span of ``tracing`` (which must be enabled); an exception marks it failed."""
    assert tracing.tracer is not None
    with tracing.tracer.start_as_current_span(
        name,
        context=parent,
        kind=kind,
        attributes=dict(attributes or {}),
        start_time=start_ns,
        record_exception=True,
        set_status_on_exception=True,
    ) as made:
        yield made


def failed(made: trace.Span, description: str) -> None:
    made.set_status(Status(StatusCode.ERROR, description))
