"""Distributed tracing: a W3C trace context (``traceparent`` / ``tracestate``) travels with every event
in its NATS headers, from the publisher (a producer's own client, the API) through every service, and into
the log lines (``trace_id``, ``span_id``).

Each service opens a CONSUMER span per message, the child of the context the message arrived with (a
message without one starts a new trace there), and a PRODUCER span per event it publishes, whose
context it injects into that event's headers, so a session's whole pipeline is one trace.

The OpenTelemetry SDK always runs, so ids exist and propagate; spans are only exported (OTLP over
HTTP, batched, off the event loop) when an endpoint is configured: ``PALACE_OTLP_ENDPOINT``, else the
standard ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_ENDPOINT``. With none, a span
is a few objects that nothing reads.

A batch handler (embed) handles many messages, possibly of many traces, in one call: it gets one span
per message, and publishes each derived event with ``caused_by=<the event it came from>`` so the event
continues its own trace; the batch's log lines carry the first message's ``trace_id`` and all of them
in ``trace_ids``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from typing import Any

import structlog
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.propagators.textmap import Getter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, format_span_id, format_trace_id

from shared.config import Settings
from shared.events.models import msg_id_event

__all__ = [
    "TRACE_HEADERS",
    "consuming",
    "extract",
    "in_batch",
    "inject",
    "otlp_traces_endpoint",
    "publishing",
    "record_failure",
    "setup_tracing",
    "trace_headers",
    "trace_log_fields",
]

TRACE_HEADERS = ("traceparent", "tracestate", "baggage")
# A proxy until ``setup_tracing`` installs the provider, then its tracer: looked up once, not per span.
_TRACER = trace.get_tracer("palace")

_provider: TracerProvider | None = None
# While a batch is handled: the context of each message's span, by the event id of that message.
_batch: ContextVar[dict[str, Context] | None] = ContextVar("palace_trace_batch", default=None)


class _HeaderGetter(Getter[Mapping[str, Any]]):
    """NATS headers are a plain dict whose keys keep the sender's case; W3C names are lower case, but a
    producer that sends ``Traceparent`` must not silently start a new trace."""

    def get(self, carrier: Mapping[str, Any], key: str) -> list[str] | None:
        value = carrier.get(key)
        if value is None:
            lower = key.lower()
            value = next((v for k, v in carrier.items() if k.lower() == lower), None)
        if value is None:
            return None
        return [str(v) for v in value] if isinstance(value, list | tuple) else [str(value)]

    def keys(self, carrier: Mapping[str, Any]) -> list[str]:
        return list(carrier.keys())


_GETTER = _HeaderGetter()


def otlp_traces_endpoint(settings: Settings) -> str | None:
    """Where spans go, or None: ``PALACE_OTLP_ENDPOINT`` (a base URL, as the OTLP spec's
    ``OTEL_EXPORTER_OTLP_ENDPOINT``), else the standard variables."""
    if settings.otlp_endpoint:
        return settings.otlp_endpoint.rstrip("/") + "/v1/traces"
    if os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        return os.environ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"]
    if os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        return os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"].rstrip("/") + "/v1/traces"
    return None


def setup_tracing(settings: Settings, service: str) -> TracerProvider:
    """Install the process's tracer provider (once; later calls return the first): the resource names
    the Palace service, and an OTLP exporter is attached only when an endpoint is configured."""
    global _provider
    if _provider is not None:
        return _provider
    provider = TracerProvider(resource=Resource.create({"service.name": service, "service.namespace": "palace"}))
    endpoint = otlp_traces_endpoint(settings)
    if endpoint:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    trace.set_tracer_provider(provider)
    _provider = provider
    return provider


def inject(headers: dict[str, str], ctx: Context | None = None) -> dict[str, str]:
    """Write the context (default: the current one) into NATS headers; nothing when there is none."""
    propagate.inject(headers, context=ctx)
    return headers


def extract(headers: Mapping[str, Any] | None) -> Context:
    """The context a message arrived with (an empty one when it has none: a new trace starts)."""
    return propagate.extract(headers or {}, getter=_GETTER)


def trace_headers(headers: Mapping[str, Any] | None) -> dict[str, str]:
    """Only the trace headers of a message, to carry them over when it is republished as is."""
    return {k.lower(): str(v) for k, v in (headers or {}).items() if k.lower() in TRACE_HEADERS}


def trace_log_fields(span: Span | None = None) -> dict[str, str]:
    """``trace_id`` / ``span_id`` of a span (default: the current one) for log lines; {} without one."""
    sc = (span or trace.get_current_span()).get_span_context()
    if not sc.is_valid:
        return {}
    return {"trace_id": format_trace_id(sc.trace_id), "span_id": format_span_id(sc.span_id)}


def in_batch() -> bool:
    """True while a handler works on several messages at once (their events cannot all be the log
    context of one line)."""
    return bool(_batch.get())


def _event_id_of(msg: Any) -> str | None:
    """A message's event id from its ``Nats-Msg-Id`` (set by ``publish_event``)."""
    msg_id = (getattr(msg, "headers", None) or {}).get("Nats-Msg-Id")
    if not msg_id:
        return None
    return msg_id_event(str(getattr(msg, "subject", "")), str(msg_id))


@contextlib.contextmanager
def consuming(durable: str, subject: str, msgs: list[Any]) -> Iterator[list[Span]]:
    """The handling of one message, or one batch: a CONSUMER span per message, child of the context it
    carries; the first is current (its ids are bound into the log context, with every message's
    ``trace_ids`` for a batch); the batch map lets
    ``publishing(cause=...)`` continue each message's own trace. Log context of the previous message
    (workspace_id, event_id) is cleared on entry and exit."""
    spans: list[Span] = []
    by_event: dict[str, Context] = {}
    for m in msgs:
        span = _TRACER.start_span(
            f"{subject} process", context=extract(getattr(m, "headers", None)), kind=SpanKind.CONSUMER,
            attributes={"messaging.system": "nats", "messaging.operation.type": "process",
                        "messaging.destination.name": subject, "messaging.consumer.group.name": durable,
                        "messaging.batch.message_count": len(msgs)},
        )
        spans.append(span)
        event_id = _event_id_of(m)
        if event_id:
            span.set_attribute("messaging.message.id", event_id)
            by_event[event_id] = trace.set_span_in_context(span)
    token = otel_context.attach(trace.set_span_in_context(spans[0]))
    batch_token = _batch.set(by_event if len(msgs) > 1 else None)
    structlog.contextvars.unbind_contextvars("workspace_id", "event_id")
    fields: dict[str, Any] = trace_log_fields(spans[0])
    if len(spans) > 1:
        fields["trace_ids"] = list(dict.fromkeys(format_trace_id(s.get_span_context().trace_id) for s in spans))
    try:
        with structlog.contextvars.bound_contextvars(**fields):
            yield spans
    finally:
        structlog.contextvars.unbind_contextvars("workspace_id", "event_id")
        _batch.reset(batch_token)
        otel_context.detach(token)
        for span in spans:
            span.end()


def record_failure(spans: list[Span], error: BaseException, outcome: str) -> None:
    """Mark the message spans failed (the exception and its stack trace become a span event)."""
    for span in spans:
        span.record_exception(error)
        span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"[:500]))
        span.set_attribute("palace.outcome", outcome)


@contextlib.contextmanager
def publishing(subject: str, headers: dict[str, str], *, event_id: str | None = None,
               cause: str | None = None) -> Iterator[Span]:
    """A PRODUCER span around one publish, injected into ``headers``. Its parent is the span of the
    message ``cause`` (an event id) when a batch is being handled, else the current span."""
    batch = _batch.get()
    parent = batch.get(cause) if batch and cause else None
    attributes: dict[str, Any] = {"messaging.system": "nats", "messaging.operation.type": "send",
                                  "messaging.destination.name": subject}
    if event_id:
        attributes["messaging.message.id"] = event_id
    with _TRACER.start_as_current_span(f"{subject} publish", context=parent, kind=SpanKind.PRODUCER,
                                         attributes=attributes) as span:
        inject(headers)
        yield span
